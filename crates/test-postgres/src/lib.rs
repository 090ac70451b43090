//! The throwaway-PostgreSQL test harness: a fresh Manifold store database
//! on either backend, for tests, fixtures (`manifold-fixture postgres`) and
//! the benchmarks.
//!
//! SQLite databases are files in a temporary directory. PostgreSQL databases
//! live in one throwaway cluster per test process: the first
//! [`TestDatabase::new`] for PostgreSQL runs `initdb` into a temporary
//! directory and starts `postgres` on a free loopback port with its unix
//! socket in that directory; every test then gets its own database
//! (`CREATE DATABASE`), so tests stay isolated and fast.
//!
//! PostgreSQL refuses to run as root. When the tests run as root, the cluster
//! runs as the system user `manifold-pg`, created once with `useradd` if it
//! is missing.
//!
//! The cluster goes away with the process: an `atexit` hook stops it with
//! `pg_ctl stop -m fast` and deletes its directory, and the postmaster is
//! started with a parent-death signal, so a test process that is killed
//! does not leave a postgres behind either. Directories of dead test
//! processes are removed at the next start.
//!
//! One cluster for a whole test run: when [`SHARED_CLUSTER_ENV`] holds the
//! URL of a running server (`manifold-fixture postgres` starts one and prints
//! it; `scripts/test.sh` exports it), every test process creates its
//! databases there instead of starting a cluster of its own.
//!
//! Nothing is skipped: if PostgreSQL cannot start, [`TestDatabase::new`]
//! panics with the server log.

use std::{
    fs,
    io::{self, Read},
    net::TcpListener,
    os::unix::{fs::chown, process::CommandExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use sqlx::{Connection, Executor};

pub use manifold_store::Backend;
use manifold_store::{Store, sqlite_url};

/// Generates `sqlite` and `postgres` test functions in a module named after
/// each listed test body: `async fn body(db: TestDatabase)`.
#[macro_export]
macro_rules! on_both_backends {
    ($($body:ident),* $(,)?) => {$(
        mod $body {
            #[tokio::test]
            async fn sqlite() {
                let db = $crate::TestDatabase::new($crate::Backend::Sqlite).await;
                super::$body(db).await;
            }

            #[tokio::test]
            async fn postgres() {
                let db = $crate::TestDatabase::new($crate::Backend::Postgres).await;
                super::$body(db).await;
            }
        }
    )*};
}

/// The variable naming a running server to create test databases on, as
/// `postgres://USER@HOST:PORT` (a superuser; no database in the path).
pub const SHARED_CLUSTER_ENV: &str = "MANIFOLD_TEST_POSTGRES_URL";

/// The system user the cluster runs as when the tests run as root.
pub const PG_USER: &str = "manifold-pg";
const DIR_PREFIX: &str = "manifold-pg-";

/// A fresh, empty database. SQLite files are deleted on drop; PostgreSQL
/// databases go with the cluster at process exit.
pub struct TestDatabase {
    backend: Backend,
    url: String,
    _dir: Option<tempfile::TempDir>,
}

impl TestDatabase {
    pub async fn new(backend: Backend) -> TestDatabase {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::Builder::new()
                    .prefix("manifold-store-")
                    .tempdir()
                    .expect("create a temporary directory");
                let url = sqlite_url(&dir.path().join("store.db"));
                TestDatabase {
                    backend,
                    url,
                    _dir: Some(dir),
                }
            }
            Backend::Postgres => TestDatabase {
                backend,
                url: match std::env::var(SHARED_CLUSTER_ENV) {
                    Ok(base) if !base.is_empty() => create_database(&base, None).await,
                    _ => pg_cluster().create_database().await,
                },
                _dir: None,
            },
        }
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Opens a store on this database (migrating it). Each call opens a new
    /// pool, like another gateway process would.
    pub async fn store(&self) -> Store {
        Store::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("open {} store at {}: {e}", self.backend, self.url))
    }
}

/// The process's throwaway PostgreSQL cluster.
#[derive(Debug)]
pub struct PgCluster {
    root: PathBuf,
    data: PathBuf,
    port: u16,
    pg_ctl: PathBuf,
    run_as: Option<(u32, u32)>,
    exited: Arc<AtomicBool>,
}

static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
static DATABASES: AtomicU64 = AtomicU64::new(0);

/// The cluster, started on first use. Panics if it cannot start.
pub fn pg_cluster() -> &'static PgCluster {
    CLUSTER.get_or_init(|| {
        let cluster = PgCluster::start().unwrap_or_else(|e| panic!("start PostgreSQL: {e}"));
        // SAFETY: registering a plain `extern "C" fn` with no captured state.
        unsafe {
            libc::atexit(stop_cluster_at_exit);
        }
        cluster
    })
}

extern "C" fn stop_cluster_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(cluster) = CLUSTER.get() {
            cluster.stop();
        }
    });
}

impl PgCluster {
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding the data dir, the socket and the server log.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A URL for database `db` as the superuser `postgres` over TCP.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The URL of the server itself, as [`SHARED_CLUSTER_ENV`] takes it.
    pub fn server_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}", self.port)
    }

    /// Creates an empty database and returns its URL.
    pub async fn create_database(&self) -> String {
        create_database(&self.server_url(), Some(self)).await
    }

    fn start() -> io::Result<PgCluster> {
        remove_stale_dirs();
        let initdb = find_pg_binary("initdb")?;
        // Use the postgres and pg_ctl that sit beside initdb, so all three
        // are the same version.
        let bin_dir = fs::canonicalize(&initdb)?
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let postgres = bin_dir.join("postgres");
        let pg_ctl = bin_dir.join("pg_ctl");
        let run_as = if unsafe { libc::geteuid() } == 0 {
            Some(ensure_pg_user()?)
        } else {
            None
        };

        let root = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
            .tempdir()?
            .keep();
        let data = root.join("data");
        if let Some((uid, gid)) = run_as {
            chown(&root, Some(uid), Some(gid))?;
        }

        let mut initdb_cmd = Command::new(&initdb);
        initdb_cmd
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ])
            .stdin(Stdio::null());
        run_as_user(&mut initdb_cmd, run_as);
        let out = initdb_cmd.output()?;
        if !out.status.success() {
            let _ = fs::remove_dir_all(&root);
            return Err(io::Error::other(format!(
                "initdb failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }

        // A port that was free a moment ago can be taken before postgres
        // binds it; try a few.
        let mut failures = Vec::new();
        for _ in 0..5 {
            let port = free_port()?;
            let cluster = PgCluster {
                root: root.clone(),
                data: data.clone(),
                port,
                pg_ctl: pg_ctl.clone(),
                run_as,
                exited: Arc::new(AtomicBool::new(false)),
            };
            match cluster.spawn_postmaster(&postgres) {
                Ok(()) => return Ok(cluster),
                Err(e) => failures.push(e.to_string()),
            }
        }
        let _ = fs::remove_dir_all(&root);
        Err(io::Error::other(failures.join("\n---\n")))
    }

    /// Starts the postmaster from a thread that lives as long as it does: the
    /// parent-death signal fires when the spawning *thread* exits, so it must
    /// not be a short-lived test thread.
    fn spawn_postmaster(&self, postgres: &Path) -> io::Result<()> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join("postgres.log"))?;
        let mut cmd = Command::new(postgres);
        cmd.arg("-D")
            .arg(&self.data)
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(&self.root)
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=300",
                "-c",
                "log_min_messages=warning",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        run_as_user(&mut cmd, self.run_as);
        // SAFETY: prctl is async-signal-safe. It runs after the uid change
        // (which would otherwise clear the parent-death signal).
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }

        let (tx, rx) = mpsc::channel();
        let exited = self.exited.clone();
        thread::Builder::new()
            .name("manifold-pg-postmaster".into())
            .spawn(move || match cmd.spawn() {
                Ok(mut child) => {
                    let _ = tx.send(Ok(()));
                    let _ = child.wait();
                    exited.store(true, Ordering::SeqCst);
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            })?;
        rx.recv()
            .map_err(|_| io::Error::other("postmaster thread died"))??;

        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.is_ready() {
                return Ok(());
            }
            if self.exited.load(Ordering::SeqCst) {
                return Err(io::Error::other(format!(
                    "postgres exited during start-up on port {}:\n{}",
                    self.port,
                    self.log_tail()
                )));
            }
            if Instant::now() > deadline {
                self.stop_postmaster();
                return Err(io::Error::other(format!(
                    "postgres not ready after 60 s:\n{}",
                    self.log_tail()
                )));
            }
            thread::sleep(Duration::from_millis(25));
        }
    }

    /// `postmaster.pid` line 8 is the server's status; `ready` once it
    /// accepts connections.
    fn is_ready(&self) -> bool {
        fs::read_to_string(self.data.join("postmaster.pid"))
            .map(|pid_file| pid_file.lines().nth(7).map(str::trim) == Some("ready"))
            .unwrap_or(false)
    }

    fn stop_postmaster(&self) {
        let mut cmd = Command::new(&self.pg_ctl);
        cmd.arg("stop")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "-t", "30"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        run_as_user(&mut cmd, self.run_as);
        let stopped = cmd.status().map(|s| s.success()).unwrap_or(false);
        if !stopped && !self.exited.load(Ordering::SeqCst) {
            // pg_ctl failed: signal the postmaster directly (immediate stop).
            if let Ok(pid_file) = fs::read_to_string(self.data.join("postmaster.pid"))
                && let Some(pid) = pid_file.lines().next().and_then(|l| l.trim().parse().ok())
            {
                unsafe {
                    libc::kill(pid, libc::SIGQUIT);
                }
                let deadline = Instant::now() + Duration::from_secs(10);
                while !self.exited.load(Ordering::SeqCst) && Instant::now() < deadline {
                    thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    /// Stops the server and deletes the cluster's directory.
    fn stop(&self) {
        self.stop_postmaster();
        let _ = fs::remove_dir_all(&self.root);
    }

    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = fs::File::open(self.root.join("postgres.log")) {
            let _ = file.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().collect();
        let start = lines.len().saturating_sub(40);
        format!("--- postgres.log (tail) ---\n{}", lines[start..].join("\n"))
    }
}

/// Creates an empty database on the server at `base` and returns its URL.
/// Names carry the process id, so processes sharing a server never collide.
async fn create_database(base: &str, cluster: Option<&PgCluster>) -> String {
    let base = base.trim_end_matches('/');
    let name = format!(
        "t_{}_{}",
        std::process::id(),
        DATABASES.fetch_add(1, Ordering::Relaxed)
    );
    let mut last_error = None;
    // CREATE DATABASE copies template1 and fails if another session is
    // copying it at that instant; retry briefly.
    for _ in 0..20 {
        let attempt = async {
            let mut conn = sqlx::PgConnection::connect(&format!("{base}/postgres")).await?;
            conn.execute(format!("CREATE DATABASE \"{name}\"").as_str())
                .await?;
            conn.close().await
        };
        match attempt.await {
            Ok(()) => return format!("{base}/{name}"),
            Err(e) => {
                last_error = Some(e);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    panic!(
        "create database {name} on {base}: {}\n{}",
        last_error.map(|e| e.to_string()).unwrap_or_default(),
        cluster.map(PgCluster::log_tail).unwrap_or_default()
    );
}

fn run_as_user(cmd: &mut Command, run_as: Option<(u32, u32)>) {
    if let Some((uid, gid)) = run_as {
        // std drops supplementary groups when root changes uid.
        cmd.uid(uid).gid(gid);
    }
}

/// The uid and gid of [`PG_USER`], creating the user if needed.
fn ensure_pg_user() -> io::Result<(u32, u32)> {
    if let Some(ids) = lookup_user(PG_USER)? {
        return Ok(ids);
    }
    let useradd = ["/usr/sbin/useradd", "/sbin/useradd"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .unwrap_or("useradd");
    let out = Command::new(useradd)
        .args([
            "--system",
            "--no-create-home",
            "--user-group",
            "--shell",
            "/usr/sbin/nologin",
            PG_USER,
        ])
        .stdin(Stdio::null())
        .output()?;
    // Exit code 9: another test process created it first.
    if !out.status.success() && out.status.code() != Some(9) {
        return Err(io::Error::other(format!(
            "useradd {PG_USER} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    lookup_user(PG_USER)?
        .ok_or_else(|| io::Error::other(format!("user {PG_USER} missing after useradd")))
}

fn lookup_user(name: &str) -> io::Result<Option<(u32, u32)>> {
    let id = |flag: &str| -> io::Result<Option<u32>> {
        let out = Command::new("id")
            .arg(flag)
            .arg(name)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()?;
        Ok(if out.status.success() {
            String::from_utf8_lossy(&out.stdout).trim().parse().ok()
        } else {
            None
        })
    };
    Ok(match (id("-u")?, id("-g")?) {
        (Some(uid), Some(gid)) => Some((uid, gid)),
        _ => None,
    })
}

/// `name` on PATH, in /usr/local/bin, or in the newest
/// /usr/lib/postgresql/*/bin.
fn find_pg_binary(name: &str) -> io::Result<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).map(|d| d.join(name)).collect())
        .unwrap_or_default();
    candidates.push(PathBuf::from("/usr/local/bin").join(name));
    let mut versions: Vec<PathBuf> = fs::read_dir("/usr/lib/postgresql")
        .map(|dir| dir.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    versions.sort_by_key(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0)
    });
    candidates.extend(versions.into_iter().rev().map(|v| v.join("bin").join(name)));
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{name} not found (install PostgreSQL: apt-get install postgresql)"),
        )
    })
}

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Removes cluster directories left by test processes that no longer run.
fn remove_stale_dirs() {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}
