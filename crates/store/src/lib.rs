//! The governance store: everything Manifold must remember across restarts and
//! share between gateway processes.
//!
//! One [`Store`] holds gateway tokens, token groups, policies, tool
//! classifications (quarantine), approvals, rate-limit counters and the three
//! audit trails. It runs on SQLite (a file in the data dir, the default) or
//! PostgreSQL (several gateway processes sharing one database) through a single
//! code path: `sqlx::AnyPool` with portable SQL. Timestamps are `i64` unix
//! milliseconds and JSON is stored as text, so both backends see the same
//! schema. Only two things differ per backend: the migration folder and the
//! row lock that audit inserts take on PostgreSQL (see `audit.rs`).
//!
//! The store knows nothing about MCP, catalogs or callers. It does not decide
//! policy: it stores rules and loads them in a constant number of statements
//! ([`Store::load_policy_inputs`]); the broker evaluates them.
//!
//! Every statement goes through one counter ([`Store::statements`]), so tests can show
//! that a code path's statement count does not grow with the catalog.

mod approvals;
mod audit;
mod audit_read;
mod batching;
mod calls;
mod chart;
mod events;
mod gateway_tasks;
mod generation;
mod glob;
mod journal;
pub mod oauth;
mod policy;
mod rate;
mod sessions;
mod sqlite_leader;
mod sqlx_task;
mod tasks;
mod tokens;
mod tools;
mod writer;

use std::{
    path::Path,
    str::FromStr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use sqlx::{
    AnyPool, ConnectOptions, Connection, Executor,
    any::{AnyArguments, AnyConnectOptions, AnyPoolOptions},
    query::Query,
};

pub use approvals::{Approval, ApprovalError, ApprovalStatus};
pub use audit::{
    AccessEvent, AccessOutcome, ActivityEvent, AuditKind, AuditRow, CallOutcome, Decision,
    DiscoveryEvent, MAX_ACCESS_TEXT_BYTES, MAX_STORED_NAME_BYTES, cut_text, hash_argument_object,
    hash_arguments, sha256_hex, visible_tools_digest,
};
pub use batching::{AuditError, LINGER, MAX_BATCH, QUEUE_CAPACITY};
pub use chart::{CHART_BUCKET_MS, CHART_BUCKETS, CHART_MAX_ROWS, CallBucket, CallChart};
pub use events::{EVENTS_CHANNEL, Notice, StoreEvent, Subscription};
pub use gateway_tasks::{GatewayTask, NewGatewayTask, TASK_WORKING};
pub use generation::GenerationReader;
pub use glob::glob_match;
pub use policy::{Effect, NewPolicy, Policy, PolicyInputs, PrincipalSelector, TierSelector};
pub use rate::RateDecision;
pub use tasks::{NewTaskRoute, TaskRoute, TasksSwept, UnseenTaskEnd};
pub use tokens::{
    Action, AuthError, DEFAULT_TOKEN_LIFETIME, Expiry, NewToken, SWEEP_BATCH, TOKEN_PREFIX,
    TokenRecord, scope_matches, token_id_of,
};
pub use tools::{
    HashCheck, NewToolStatus, RiskTier, ToolClassification, ToolObservation, ToolStatus,
};
pub use writer::{AuditCommit, AuditWriter, RequestRows, RowComing};

/// The file name of the SQLite database inside a data dir.
pub const SQLITE_FILE_NAME: &str = "manifold.db";

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unsupported database URL '{0}' (expected sqlite://PATH or postgres://...)")]
    UnsupportedUrl(String),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("cannot create the data dir {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid {what}: {reason}")]
    Invalid { what: &'static str, reason: String },
    #[error("{what} '{id}' not found")]
    NotFound { what: &'static str, id: String },
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("stored {what} is unreadable: {value:?}")]
    Corrupt { what: &'static str, value: String },
}

impl StoreError {
    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        StoreError::Invalid {
            what,
            reason: reason.into(),
        }
    }

    pub(crate) fn corrupt(what: &'static str, value: impl Into<String>) -> Self {
        StoreError::Corrupt {
            what,
            value: value.into(),
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Which database a [`Store`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// The backend a database URL names.
    pub fn of_url(url: &str) -> Result<Backend> {
        if url.starts_with("sqlite:") {
            Ok(Backend::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Backend::Postgres)
        } else {
            Err(StoreError::UnsupportedUrl(redact_url(url)))
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Pool settings.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub max_connections: u32,
    pub acquire_timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_connections: 8,
            acquire_timeout: Duration::from_secs(10),
        }
    }
}

/// The governance store. Cheap to clone: clones share the pool and the
/// statement counter. Two `Store`s opened on the same database behave like two
/// gateway processes.
#[derive(Debug, Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// Kept for the PostgreSQL listener, which needs its own connection.
    url: DatabaseUrl,
    /// Tells this store's own events from other processes' ones.
    instance: Arc<str>,
    statements: Arc<AtomicU64>,
    /// Governance writes committed through this store (see `generation.rs`).
    governance_writes: Arc<AtomicU64>,
    /// When on, the text of every statement, for tests that show what a code
    /// path reads.
    statement_log: Arc<StatementLog>,
    /// This store's SQLite audit leaders, which readers of the audit
    /// trails flush first (their journaled rows commit just after replies).
    leaders: Arc<Leaders>,
}

#[derive(Default)]
struct Leaders(std::sync::Mutex<Vec<std::sync::Weak<sqlite_leader::SqliteLeader>>>);

impl std::fmt::Debug for Leaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Leaders")
    }
}

/// A database URL that never prints its password.
#[derive(Clone)]
struct DatabaseUrl(Arc<str>);

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

#[derive(Debug, Default)]
struct StatementLog {
    on: std::sync::atomic::AtomicBool,
    lines: std::sync::Mutex<Vec<String>>,
}

impl Store {
    /// Opens (creating if needed) the database at `url` and applies pending
    /// migrations. `sqlite://PATH?mode=rwc` or `postgres://...`.
    pub async fn connect(url: &str) -> Result<Store> {
        Store::connect_with(url, StoreOptions::default()).await
    }

    /// Opens the default SQLite database in `data_dir` (created if missing).
    pub async fn open_data_dir(data_dir: &Path) -> Result<Store> {
        std::fs::create_dir_all(data_dir).map_err(|source| StoreError::DataDir {
            path: data_dir.display().to_string(),
            source,
        })?;
        Store::connect(&sqlite_url(&data_dir.join(SQLITE_FILE_NAME))).await
    }

    pub async fn connect_with(url: &str, options: StoreOptions) -> Result<Store> {
        sqlx::any::install_default_drivers();
        let backend = Backend::of_url(url)?;
        let connect_options = AnyConnectOptions::from_str(url)?.disable_statement_logging();
        let mut pool_options = AnyPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(options.acquire_timeout);

        match backend {
            Backend::Sqlite => {
                // WAL lets readers run beside the one writer and is a property
                // of the file, so it is set once, before the pool opens, on a
                // single connection (switching needs an exclusive lock that
                // busy_timeout cannot wait for). Migrations run on the same
                // connection.
                let mut conn = sqlx::AnyConnection::connect_with(&connect_options).await?;
                if !is_sqlite_memory(url) {
                    conn.execute("PRAGMA journal_mode = WAL").await?;
                }
                SQLITE_MIGRATIONS.run_direct(&mut conn).await?;
                conn.close().await?;
                if let Some(path) = sqlite_file(url) {
                    // Rows a stopped process journaled but never committed.
                    let replayed =
                        tokio::task::spawn_blocking(move || journal::replay_orphans(&path)).await;
                    match replayed {
                        Ok(Ok(_)) => {}
                        Ok(Err(error)) => {
                            tracing::error!(%error, "audit journals of stopped processes not written")
                        }
                        Err(error) => tracing::error!(%error, "audit journal replay panicked"),
                    }
                }
                if is_sqlite_memory(url) {
                    // Each connection to :memory: would be its own database.
                    pool_options = pool_options
                        .max_connections(1)
                        .min_connections(1)
                        .idle_timeout(None)
                        .max_lifetime(None);
                }
                pool_options = pool_options.after_connect(|conn, _meta| {
                    Box::pin(async move {
                        // Safe with WAL: a crash can lose the last commits but
                        // never corrupts the file.
                        conn.execute("PRAGMA synchronous = NORMAL").await?;
                        Ok(())
                    })
                });
                let pool = pool_options.connect_with(connect_options).await?;
                if is_sqlite_memory(url) {
                    SQLITE_MIGRATIONS.run(&pool).await?;
                }
                Ok(Store::from_pool(pool, backend, url))
            }
            Backend::Postgres => {
                let pool = pool_options.connect_with(connect_options).await?;
                // sqlx takes an advisory lock, so concurrent gateway processes
                // starting on one database migrate once.
                POSTGRES_MIGRATIONS.run(&pool).await?;
                Ok(Store::from_pool(pool, backend, url))
            }
        }
    }

    fn from_pool(pool: AnyPool, backend: Backend, url: &str) -> Store {
        Store {
            pool,
            backend,
            url: DatabaseUrl(url.into()),
            instance: random_id::<8>("").into(),
            statements: Arc::new(AtomicU64::new(0)),
            governance_writes: Arc::new(AtomicU64::new(0)),
            statement_log: Arc::default(),
            leaders: Arc::default(),
        }
    }

    pub(crate) fn register_leader(&self, leader: &Arc<sqlite_leader::SqliteLeader>) {
        let mut leaders = self.leaders.0.lock().unwrap_or_else(|p| p.into_inner());
        leaders.retain(|w| w.strong_count() > 0);
        leaders.push(Arc::downgrade(leader));
    }

    /// Commits the rows this store's leaders have journaled but not yet
    /// committed, so that a read of the audit trails sees every row whose
    /// call has been answered.
    pub(crate) async fn settle_audit(&self) {
        let leaders: Vec<_> = self
            .leaders
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        for leader in leaders {
            // A row the database refused was logged by the leader.
            let _ = leader.flush().await;
        }
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// How many statements this store (and its clones) has executed since it
    /// was opened. Migrations are not counted.
    pub fn statements(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    /// Starts (or stops) keeping the text of each statement this store and
    /// its clones run; [`Store::take_statement_log`] hands them over.
    pub fn log_statements(&self, on: bool) {
        self.statement_log.on.store(on, Ordering::SeqCst);
    }

    pub fn take_statement_log(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .statement_log
                .lines
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        )
    }

    /// One trivial statement: whether the database answers now.
    pub async fn ping(&self) -> Result<()> {
        self.query("SELECT 1").execute(self.pool()).await?;
        Ok(())
    }

    /// Closes the pool, waiting for connections to be returned.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Every statement the store runs is built here, and each built query is
    /// executed exactly once, so counting construction counts execution.
    pub(crate) fn query<'q>(&self, sql: &'q str) -> Query<'q, sqlx::Any, AnyArguments<'q>> {
        self.note_statement(sql);
        sqlx::query(sql)
    }

    /// Counts (and, when on, logs) one statement, whichever connection runs it.
    pub(crate) fn note_statement(&self, sql: &str) {
        self.statements.fetch_add(1, Ordering::Relaxed);
        if self.statement_log.on.load(Ordering::Relaxed) {
            self.statement_log
                .lines
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(sql.to_string());
        }
    }

    /// The SQLite file behind this store; none for PostgreSQL or an
    /// in-memory database.
    pub(crate) fn sqlite_path(&self) -> Option<std::path::PathBuf> {
        if self.backend != Backend::Sqlite {
            return None;
        }
        sqlite_file(&self.url.0)
    }

    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }
}

/// The file a SQLite URL names; none for an in-memory database.
fn sqlite_file(url: &str) -> Option<std::path::PathBuf> {
    if is_sqlite_memory(url) {
        return None;
    }
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url).ok()?;
    Some(options.get_filename().to_path_buf())
}

/// The URL of a SQLite database file, created on first open.
pub fn sqlite_url(path: &Path) -> String {
    // sqlx percent-decodes the path, so `%`, `?` and `#` in it are encoded.
    let path = path
        .display()
        .to_string()
        .replace('%', "%25")
        .replace('?', "%3F")
        .replace('#', "%23");
    format!("sqlite://{path}?mode=rwc")
}

/// Now, in unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn is_sqlite_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

/// A URL fit for an error message: the password, if any, is replaced.
fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// `n` random bytes from the operating system.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("the operating system's random source failed");
    bytes
}

/// A random identifier: `prefix` followed by `2 * N` lowercase hex digits.
pub(crate) fn random_id<const N: usize>(prefix: &str) -> String {
    format!("{prefix}{}", hex::encode(random_bytes::<N>()))
}

/// Reads a JSON array of strings stored as text.
pub(crate) fn json_strings(what: &'static str, text: &str) -> Result<Vec<String>> {
    serde_json::from_str(text).map_err(|_| StoreError::corrupt(what, text))
}

pub(crate) fn to_i64(what: &'static str, value: u64) -> Result<i64> {
    i64::try_from(value).map_err(|_| StoreError::invalid(what, format!("{value} is too large")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_kinds_parse_by_name() {
        for kind in AuditKind::ALL {
            assert_eq!(kind.as_str().parse::<AuditKind>().unwrap(), kind);
        }
        let err = "everything".parse::<AuditKind>().unwrap_err().to_string();
        assert!(
            err.contains("'everything'") && err.contains("activity"),
            "{err}"
        );
    }

    #[test]
    fn backend_of_url() {
        assert_eq!(
            Backend::of_url("sqlite:///tmp/x.db?mode=rwc").unwrap(),
            Backend::Sqlite
        );
        assert_eq!(
            Backend::of_url("postgres://u@localhost/db").unwrap(),
            Backend::Postgres
        );
        assert_eq!(
            Backend::of_url("postgresql://u@localhost/db").unwrap(),
            Backend::Postgres
        );
        let err = Backend::of_url("mysql://root:hunter2@db/x").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn random_ids_have_the_asked_shape() {
        let id = random_id::<6>("x_");
        assert_eq!(id.len(), 2 + 12);
        assert!(id[2..].chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(random_id::<6>(""), random_id::<6>(""));
    }
}
