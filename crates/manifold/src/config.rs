//! The TOML config file.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use manifold_search::Strategy;
use manifold_server::Mode;
use manifold_upstream::UpstreamConfig;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub gateway: GatewayConfig,
    #[serde(default)]
    pub store: StoreConfig,
    #[serde(default)]
    pub auth: AuthSection,
    #[serde(default)]
    pub admission: AdmissionSection,
    #[serde(default)]
    pub governance: GovernanceSection,
    #[serde(default)]
    pub code_mode: CodeModeSection,
    #[serde(default)]
    pub admin: AdminSection,
    #[serde(default)]
    pub search: SearchSection,
    /// Checked here with the rest; read before the config loads (logging
    /// starts first) by [`Config::log_format_of`].
    #[serde(default)]
    #[allow(dead_code)]
    pub log: LogSection,
    /// Checked here too; read before the config loads by
    /// [`Config::telemetry_of`], since traces start with logging.
    #[serde(default)]
    #[allow(dead_code)]
    pub telemetry: crate::telemetry::TelemetrySection,
    /// `manifold export`, `GET /export` and the provider search formats.
    #[serde(default)]
    pub export: manifold_export::ExportConfig,
    /// Rules seeded into the store at start (added if no identical rule is
    /// there yet; never removed: the store is the source of truth).
    #[serde(default)]
    pub policies: Vec<PolicySeed>,
    #[serde(default)]
    pub servers: Vec<UpstreamConfig>,
    /// The folder the config file is in; relative paths resolve against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// Bounds on concurrent discovery (`tools/list`, `server/discover`,
/// `search_tools`, `get_tool_details`, `search_available_servers`) over HTTP.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionSection {
    #[serde(default = "default_max_active")]
    pub max_active: usize,
    #[serde(default = "default_max_queued")]
    pub max_queued: usize,
    #[serde(default = "default_retry_after")]
    pub retry_after_seconds: u64,
}

impl Default for AdmissionSection {
    fn default() -> Self {
        toml::from_str("").expect("empty admission config is valid")
    }
}

impl AdmissionSection {
    pub fn to_config(&self) -> manifold_server::AdmissionConfig {
        manifold_server::AdmissionConfig {
            max_active: self.max_active.max(1),
            max_queued: self.max_queued,
            retry_after: std::time::Duration::from_secs(self.retry_after_seconds.max(1)),
        }
    }
}

fn default_max_active() -> usize {
    2
}
fn default_max_queued() -> usize {
    32
}
fn default_retry_after() -> u64 {
    1
}

/// `[search]`: the embedding model behind the `embedding` and `hybrid`
/// strategies (`[search.embedding]`, see `manifold_embed::EmbeddingConfig`)
/// and the optional reranker (`[search.rerank]`).
/// The default strategy is `[gateway] search_strategy`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchSection {
    #[serde(default)]
    pub embedding: manifold_embed::EmbeddingConfig,
    /// The optional `rerank` strategy's chat endpoint; off when absent.
    #[serde(default)]
    pub rerank: Option<manifold_embed::RerankConfig>,
}

impl SearchSection {
    /// The embedding config with relative `model_dir` and `cache_dir`
    /// resolved against the config's folder.
    pub fn embedding_resolved(&self, base: &Path) -> manifold_embed::EmbeddingConfig {
        let mut e = self.embedding.clone();
        for dir in [&mut e.model_dir, &mut e.cache_dir].into_iter().flatten() {
            if dir.is_relative() {
                *dir = base.join(&*dir);
            }
        }
        e
    }
}

/// How the gateway logs.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// `text` (default) or `json`; `--log-format` overrides it.
    #[serde(default)]
    pub format: crate::telemetry::LogFormat,
}

/// Who may use `/mcp`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSection {
    /// Require a gateway token. Unset: required whenever `listen` is not a
    /// loopback address.
    pub required: Option<bool>,
    /// The public URL of `/mcp`, for RFC 9728 metadata behind a proxy, and
    /// the audience access tokens from the identity provider must name.
    pub resource_url: Option<String>,
    /// Callers may sign in with this OpenID provider.
    pub oidc: Option<OidcSection>,
}

/// `[auth.oidc]`: the gateway as an OAuth resource server for callers.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcSection {
    /// The provider's issuer URL, exactly as its tokens carry it.
    pub issuer: String,
    /// The claim that names the user; it becomes principal `user:<value>`.
    #[serde(default = "default_principal_claim")]
    pub principal_claim: String,
    /// The claim listing the user's groups (`group:<g>` in policies); `""`
    /// for none.
    #[serde(default = "default_groups_claim")]
    pub groups_claim: String,
    /// OAuth scope → the action (or actions) it grants. Default:
    /// `manifold:discover`, `manifold:call`, `manifold:code`,
    /// `manifold:admin`.
    #[serde(default)]
    pub scopes: Option<std::collections::BTreeMap<String, OneOrMany>>,
    /// Accepted signature algorithms (asymmetric only). Default: RS, PS and
    /// ES families.
    #[serde(default)]
    pub algorithms: Option<Vec<String>>,
    /// Clock skew allowed on `exp` and `nbf`.
    #[serde(default = "default_leeway_seconds")]
    pub leeway_seconds: u64,
    /// How long the provider's keys are used before they are read again (a
    /// token with an unknown key id re-reads them sooner).
    #[serde(default = "default_jwks_refresh_seconds")]
    pub jwks_refresh_seconds: u64,
}

/// One action or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

fn default_principal_claim() -> String {
    "sub".into()
}
fn default_groups_claim() -> String {
    "groups".into()
}
fn default_leeway_seconds() -> u64 {
    60
}
fn default_jwks_refresh_seconds() -> u64 {
    300
}

impl OidcSection {
    /// The verifier and scope mapping these settings describe; `audience`
    /// is `[auth] resource_url`.
    pub fn callers(&self, audience: &str) -> anyhow::Result<manifold_server::OidcCallers> {
        use manifold_store::Action;
        let mut settings = manifold_identity::OidcSettings::new(&self.issuer, audience);
        settings.principal_claim = self.principal_claim.clone();
        settings.groups_claim = Some(self.groups_claim.clone()).filter(|c| !c.is_empty());
        if let Some(names) = &self.algorithms {
            settings.algorithms = names
                .iter()
                .map(|n| manifold_identity::parse_algorithm(n).map_err(anyhow::Error::msg))
                .collect::<anyhow::Result<_>>()?;
            if settings.algorithms.is_empty() {
                bail!("auth.oidc.algorithms is empty");
            }
        }
        settings.leeway = std::time::Duration::from_secs(self.leeway_seconds);
        settings.jwks_refresh = std::time::Duration::from_secs(self.jwks_refresh_seconds.max(1));
        let scopes = match &self.scopes {
            None => manifold_server::OidcCallers::default_scopes(),
            Some(map) => map
                .iter()
                .map(|(scope, actions)| {
                    let names = match actions {
                        OneOrMany::One(one) => vec![one.clone()],
                        OneOrMany::Many(many) => many.clone(),
                    };
                    let actions = names
                        .iter()
                        .map(|n| n.parse::<Action>().map_err(anyhow::Error::from))
                        .collect::<anyhow::Result<_>>()
                        .with_context(|| format!("auth.oidc.scopes.{scope:?}"))?;
                    Ok((scope.clone(), actions))
                })
                .collect::<anyhow::Result<_>>()?,
        };
        Ok(manifold_server::OidcCallers {
            verifier: manifold_identity::AccessTokenVerifier::new(settings)
                .map_err(anyhow::Error::msg)?,
            scopes,
        })
    }
}

/// What the admin API may change while the gateway runs.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminSection {
    /// Let `POST /admin/servers` (and the console) add servers at run time.
    pub allow_runtime_servers: bool,
    /// Globs a runtime-added stdio server's command must match.
    pub allowed_commands: Vec<String>,
    /// Hosts a runtime-added HTTP server may use although they are, or
    /// resolve to, loopback, private or link-local addresses.
    pub allowed_hosts: Vec<String>,
}

impl AdminSection {
    pub fn runtime_servers(&self) -> manifold_server::admin::ops::RuntimeServers {
        manifold_server::admin::ops::RuntimeServers {
            allow: self.allow_runtime_servers,
            allowed_commands: self.allowed_commands.clone(),
            allowed_hosts: self.allowed_hosts.clone(),
        }
    }
}

/// Code mode: the `execute_code` meta-tool and its sandbox. Every field has
/// a default.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CodeModeSection {
    pub enabled: bool,
    /// `process` (isolated workers) or `in_process` (a thread; no isolation).
    pub sandbox: manifold_codemode::pool::SandboxMode,
    /// Workers kept started, which is also how many scripts run at once.
    pub workers: usize,
    pub cpu_ms: u64,
    pub wall_ms: u64,
    pub memory_mb: usize,
    pub max_calls: u64,
    pub max_concurrent_calls: usize,
    pub max_output_bytes: usize,
    /// After a run read from an `untrusted` server, writes to another server
    /// need approval.
    pub taint_rule: bool,
    /// Refuse every run (a clear error from `execute_code`) when an
    /// isolation layer cannot be applied. On by default: code mode fails
    /// closed. `false`, or `sandbox = "in_process"`, are explicit opt-outs
    /// that `manifold doctor` reports.
    pub require_isolation: bool,
    /// Runs that may wait for a worker at once; the next gets
    /// `code_mode_busy`.
    pub max_queued: usize,
    /// Runs one caller may have running or waiting at once.
    pub max_runs_per_principal: usize,
    /// How long a run waits for a worker before `code_mode_busy`.
    pub queue_timeout_ms: u64,
    pub network_namespace: bool,
    pub landlock: bool,
    pub seccomp: bool,
}

impl Default for CodeModeSection {
    fn default() -> Self {
        let limits = manifold_codemode::pool::RunLimits::default();
        let admission = manifold_codemode::pool::RunAdmission::default();
        let isolation = manifold_codemode::isolation::IsolationConfig::default();
        CodeModeSection {
            enabled: true,
            sandbox: Default::default(),
            workers: 2,
            cpu_ms: limits.engine.cpu_ms,
            wall_ms: limits.engine.wall_ms,
            memory_mb: limits.engine.memory_bytes >> 20,
            max_calls: limits.max_calls,
            max_concurrent_calls: limits.max_concurrent_calls,
            max_output_bytes: limits.max_output_bytes,
            taint_rule: true,
            require_isolation: true,
            max_queued: admission.max_queued,
            max_runs_per_principal: admission.max_runs_per_principal,
            queue_timeout_ms: admission.queue_timeout.as_millis() as u64,
            network_namespace: isolation.network_namespace,
            landlock: isolation.landlock,
            seccomp: isolation.seccomp,
        }
    }
}

impl CodeModeSection {
    pub fn limits(&self) -> manifold_codemode::pool::RunLimits {
        let mut limits = manifold_codemode::pool::RunLimits::default();
        limits.engine.cpu_ms = self.cpu_ms.max(1);
        limits.engine.wall_ms = self.wall_ms.max(1);
        limits.engine.memory_bytes = self.memory_mb.max(1) << 20;
        limits.engine.log_bytes = self.max_output_bytes.saturating_mul(2).max(1024);
        limits.max_calls = self.max_calls;
        limits.max_concurrent_calls = self.max_concurrent_calls.max(1);
        limits.max_output_bytes = self.max_output_bytes;
        limits
    }

    pub fn admission(&self) -> manifold_codemode::pool::RunAdmission {
        manifold_codemode::pool::RunAdmission {
            max_queued: self.max_queued,
            max_runs_per_principal: self.max_runs_per_principal.max(1),
            queue_timeout: std::time::Duration::from_millis(self.queue_timeout_ms),
        }
    }

    pub fn isolation(&self) -> manifold_codemode::isolation::IsolationConfig {
        manifold_codemode::isolation::IsolationConfig {
            network_namespace: self.network_namespace,
            landlock: self.landlock,
            seccomp: self.seccomp,
            ..Default::default()
        }
    }
}

/// How calls are governed. Every field has a default.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GovernanceSection {
    /// `allow`, `deny` or `require_approval` when no policy matches.
    #[serde(default = "default_effect")]
    pub default_effect: String,
    /// Hide and block newly seen write/destructive tools until approved.
    #[serde(default)]
    pub quarantine_new_tools: bool,
    /// Hide and block a tool whose definition changed since its approval.
    #[serde(default = "yes")]
    pub quarantine_changed_tools: bool,
    /// How long a call needing approval waits before answering
    /// `approval_required` (0: answer at once).
    #[serde(default = "default_approval_wait")]
    pub approval_wait_seconds: u64,
    #[serde(default = "default_approval_ttl")]
    pub approval_ttl_seconds: u64,
    /// How often a waiting call re-reads its approval when no event says it
    /// was decided. Default: 200 ms on SQLite; 1000 ms on PostgreSQL, where
    /// a decision made by any process arrives as an event.
    pub approval_poll_ms: Option<u64>,
    /// POSTed a JSON event for each new approval request.
    pub approval_webhook: Option<String>,
    /// Keep redacted call arguments in the activity audit.
    #[serde(default)]
    pub audit_arguments: bool,
    /// Mask secrets (cloud keys, tokens, private keys, JWTs, connection
    /// string passwords) in tool results before they reach the model.
    #[serde(default = "yes")]
    pub mask_secrets: bool,
    /// Cut a result's text content past this many characters, with a
    /// marker; per server `max_result_chars` overrides it. 0: no limit.
    #[serde(default)]
    pub max_result_chars: usize,
    /// Audit rows (discovery, access, activity) older than this many days
    /// are deleted by the sweeps; 0 keeps them forever.
    #[serde(default = "default_audit_retention_days")]
    pub audit_retention_days: u64,
    /// `sync` (default): a reply is sent once its audit row is committed.
    /// `async`: once it is queued; a crash can lose the rows of the last
    /// few milliseconds (the queue and the batch being written).
    #[serde(default = "default_audit_commit")]
    pub audit_commit: String,
    /// Let the taint rule ask the caller's own client (MCP elicitation, where
    /// it declares it and can be asked) to confirm its script's cross-server
    /// write. Never used for an operator's `require_approval` policy.
    #[serde(default = "yes")]
    pub approval_elicitation: bool,
    /// Argument keys (case-insensitive substrings) whose values are redacted.
    pub redact_keys: Option<Vec<String>>,
    /// Seconds between cleanup passes (expired tokens, approvals, windows).
    #[serde(default = "default_sweep_interval")]
    pub sweep_interval_seconds: u64,
}

impl Default for GovernanceSection {
    fn default() -> Self {
        toml::from_str("").expect("empty governance config is valid")
    }
}

fn default_audit_commit() -> String {
    "sync".into()
}

fn default_audit_retention_days() -> u64 {
    manifold_broker::DEFAULT_AUDIT_RETENTION_DAYS
}

fn default_effect() -> String {
    "allow".into()
}
fn default_approval_wait() -> u64 {
    30
}
fn default_approval_ttl() -> u64 {
    3600
}
fn default_sweep_interval() -> u64 {
    300
}

/// A policy rule in the config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySeed {
    /// `*`, `token:<id>`, `user:<id>` or `group:<name>`.
    #[serde(default = "star")]
    pub principal: String,
    #[serde(default = "star")]
    pub server: String,
    #[serde(default = "star")]
    pub tool: String,
    /// `any`, `read_only`, `write` or `destructive`.
    #[serde(default = "any")]
    pub tier: String,
    pub effect: String,
    /// For `rate_limit`: calls per window.
    pub limit: Option<u32>,
    pub window_seconds: Option<u32>,
    #[serde(default)]
    pub description: String,
}

fn star() -> String {
    "*".into()
}
fn any() -> String {
    "any".into()
}

/// Where governance state lives.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `postgres://…` for a shared database; unset: SQLite in `data_dir`.
    /// `MANIFOLD_DATABASE_URL` overrides it, so a password need not sit in
    /// the file.
    pub database_url: Option<String>,
    /// Holds `manifold.db` when no URL is given. Relative to the config's
    /// folder; default `.manifold`.
    pub data_dir: Option<PathBuf>,
    /// A file holding the secret that seals OAuth tokens in the store
    /// (`MANIFOLD_SECRET_KEY` overrides it). Unset on SQLite: a key is made
    /// in the data dir on first use.
    pub secret_key_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    #[serde(default = "default_listen")]
    pub listen: String,
    #[serde(default)]
    pub mode: Mode,
    #[serde(default = "default_context_window")]
    pub context_window_tokens: usize,
    #[serde(default = "default_threshold")]
    pub threshold_percent: f64,
    /// `server__tool` names; a single-server set-up may turn this off.
    #[serde(default = "yes")]
    pub qualify_names: bool,
    /// `search_tools`' default strategy: `hybrid` (the default; BM25F when
    /// no embedding model is loaded), `bm25`, `embedding`, `regex` or
    /// `rerank` (needs `[search.rerank]`).
    #[serde(default)]
    pub search_strategy: Strategy,
    /// Host names accepted on `/mcp` besides loopback (DNS-rebinding guard).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// On SIGTERM, how long in-flight requests may take to finish before
    /// the gateway stops anyway.
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout_ms: u64,
    /// Give legacy (2025-11-25 and older) HTTP clients a session, which
    /// sampling and elicitation requests to them need. Off: every request is
    /// stateless and GET/DELETE on `/mcp` are 405. 2026-07-28 clients are
    /// stateless either way.
    #[serde(default)]
    pub legacy_sessions: bool,
    /// Answer plain direct-mode `tools/call` requests of session-free
    /// clients without rmcp's per-request machinery (same wire, less CPU).
    /// Off: every request goes through rmcp.
    #[serde(default = "yes")]
    pub fast_calls: bool,
    /// Request bodies over this many bytes are refused with 413.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// Where users reach this gateway (`https://gw.example.com`), behind
    /// any proxy. An https URL marks the console's cookie `Secure` with the
    /// `__Host-` prefix.
    #[serde(default)]
    pub public_url: Option<String>,
    /// A console sign-in ends after this many minutes without a request.
    #[serde(default = "default_console_idle")]
    pub console_idle_minutes: u64,
    /// ... and this many hours after sign-in, however busy.
    #[serde(default = "default_console_hours")]
    pub console_session_hours: u64,
}

fn default_console_idle() -> u64 {
    30
}
fn default_console_hours() -> u64 {
    12
}

impl Default for GatewayConfig {
    fn default() -> Self {
        toml::from_str("").expect("empty gateway config is valid")
    }
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
fn default_max_body_bytes() -> usize {
    4 * 1024 * 1024
}
fn default_drain_timeout() -> u64 {
    30_000
}
fn default_context_window() -> usize {
    200_000
}
fn default_threshold() -> f64 {
    2.0
}
fn yes() -> bool {
    true
}

impl Config {
    /// The `[log] format` of a config's text, if it names one; used before
    /// logging starts, so it never fails.
    pub fn log_format_of(text: &str) -> Option<crate::telemetry::LogFormat> {
        #[derive(Deserialize)]
        struct LogOnly {
            log: LogSection,
        }
        let only: LogOnly = toml::from_str(text).ok()?;
        Some(only.log.format)
    }

    /// The `[telemetry]` section of a config's text (default if missing or
    /// unreadable); used before logging starts, so it never fails.
    pub fn telemetry_of(text: &str) -> crate::telemetry::TelemetrySection {
        #[derive(Deserialize)]
        struct TelemetryOnly {
            #[serde(default)]
            telemetry: crate::telemetry::TelemetrySection,
        }
        toml::from_str::<TelemetryOnly>(text)
            .map(|only| only.telemetry)
            .unwrap_or_default()
    }

    /// Read and check a config file. Relative commands and working directories
    /// resolve against the file's folder, so a config works from anywhere.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        // `Path::new("m.toml").parent()` is `Some("")`: treat that as ".".
        let base = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let base = std::fs::canonicalize(&base).unwrap_or(base);
        Self::parse(&text, base).with_context(|| format!("invalid config {}", path.display()))
    }

    /// Parse and check a config's text; relative paths resolve against `base`.
    pub fn parse(text: &str, base: PathBuf) -> anyhow::Result<Self> {
        let mut config: Config = toml::from_str(text)?;
        config.base_dir = base.clone();
        let mut seen = std::collections::HashSet::new();
        for server in &mut config.servers {
            server.validate().map_err(anyhow::Error::msg)?;
            if !seen.insert(server.name.clone()) {
                bail!("server name '{}' appears twice", server.name);
            }
            if server.command.is_some() {
                server.cwd = Some(match server.cwd.take() {
                    Some(cwd) if cwd.is_relative() => base.join(cwd),
                    Some(cwd) => cwd,
                    None => base.clone(),
                });
                server.command = server.command.take().map(|c| resolve_command(&c, &base));
            }
        }
        config.governance_config().context("invalid [governance]")?;
        for (i, seed) in config.policies.iter().enumerate() {
            seed.to_new_policy()
                .with_context(|| format!("invalid [[policies]] entry {}", i + 1))?;
        }
        if config.gateway.public_url.is_none()
            && let Some(server) = config
                .servers
                .iter()
                .find(|s| s.credentials == manifold_upstream::Credentials::PerPrincipal)
        {
            bail!(
                "server '{}': credentials = \"per_principal\" needs [gateway] public_url: each caller's sign-in returns to <public_url>/oauth/callback",
                server.name
            );
        }
        if let Some(oidc) = &config.auth.oidc {
            let Some(resource_url) = &config.auth.resource_url else {
                bail!(
                    "[auth.oidc] needs [auth] resource_url: the gateway's public /mcp URL, which access tokens must name as their audience"
                );
            };
            oidc.callers(resource_url).context("invalid [auth.oidc]")?;
        }
        if !(config.gateway.threshold_percent > 0.0 && config.gateway.threshold_percent <= 100.0) {
            bail!("gateway.threshold_percent must be in (0, 100]");
        }
        Ok(config)
    }
}

impl Config {
    /// The database URL: `MANIFOLD_DATABASE_URL`, else `store.database_url`,
    /// else a SQLite file in the data dir.
    pub fn database_url(&self) -> String {
        if let Ok(url) = std::env::var("MANIFOLD_DATABASE_URL")
            && !url.trim().is_empty()
        {
            return url;
        }
        if let Some(url) = &self.store.database_url {
            return url.clone();
        }
        manifold_store::sqlite_url(&self.data_dir().join(manifold_store::SQLITE_FILE_NAME))
    }

    pub fn data_dir(&self) -> PathBuf {
        match &self.store.data_dir {
            Some(dir) if dir.is_absolute() => dir.clone(),
            Some(dir) => self.base_dir.join(dir),
            None => self.base_dir.join(".manifold"),
        }
    }

    /// Whether `/mcp` needs a gateway token when listening on `listen`.
    pub fn auth_required(&self, listen: &str) -> bool {
        self.auth.required.unwrap_or_else(|| !is_loopback(listen))
    }

    /// The security-relevant settings that are off or weakened, as
    /// (setting, why it matters), for `manifold doctor`.
    pub fn security_warnings(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let listen = &self.gateway.listen;
        if !is_loopback(listen) && !self.auth_required(listen) {
            out.push((
                "auth.required",
                format!("auth is off on {listen}, which is not a loopback address: anyone who can reach it can call every tool"),
            ));
        }
        if self.admin.allow_runtime_servers {
            out.push((
                "admin.allow_runtime_servers",
                format!(
                    "admin tokens may add servers at run time (commands matching {:?}; hosts {:?} besides public ones)",
                    self.admin.allowed_commands, self.admin.allowed_hosts
                ),
            ));
        }
        let code = &self.code_mode;
        if code.enabled {
            if code.sandbox == manifold_codemode::pool::SandboxMode::InProcess {
                out.push((
                    "code_mode.sandbox",
                    "scripts run in the gateway's process, with no isolation layer".into(),
                ));
            } else {
                let off: Vec<&str> = [
                    ("network_namespace", code.network_namespace),
                    ("landlock", code.landlock),
                    ("seccomp", code.seccomp),
                ]
                .into_iter()
                .filter(|(_, on)| !on)
                .map(|(name, _)| name)
                .collect();
                if !off.is_empty() {
                    out.push((
                        "code_mode isolation",
                        format!("isolation layers turned off: {}", off.join(", ")),
                    ));
                }
                if !code.require_isolation {
                    out.push((
                        "code_mode.require_isolation",
                        "scripts run even when an isolation layer is inactive on this host".into(),
                    ));
                }
            }
        }
        if self.governance.approval_elicitation {
            out.push((
                "governance.approval_elicitation",
                "the taint rule may ask a caller's own client to confirm its script's cross-server write".into(),
            ));
        }
        if self.governance.audit_commit == "async" {
            out.push((
                "governance.audit_commit",
                "replies do not wait for their audit rows; a crash can lose the last few milliseconds of them".into(),
            ));
        }
        if !self.governance.mask_secrets {
            out.push((
                "governance.mask_secrets",
                "secrets in tool results reach the model unmasked".into(),
            ));
        }
        out
    }

    pub fn governance_config(&self) -> anyhow::Result<manifold_broker::GovernanceConfig> {
        use std::time::Duration;
        let g = &self.governance;
        let default_effect = match g.default_effect.as_str() {
            "allow" => manifold_store::Effect::Allow,
            "deny" => manifold_store::Effect::Deny,
            "require_approval" => manifold_store::Effect::RequireApproval,
            other => bail!("default_effect '{other}' (expected allow, deny or require_approval)"),
        };
        let audit_commit = match g.audit_commit.as_str() {
            "sync" => manifold_store::AuditCommit::Sync,
            "async" => manifold_store::AuditCommit::Async,
            other => bail!("governance.audit_commit '{other}' (expected sync or async)"),
        };
        let mut config = manifold_broker::GovernanceConfig {
            default_effect,
            quarantine: manifold_broker::QuarantineRules {
                new_tools: g.quarantine_new_tools,
                changed_tools: g.quarantine_changed_tools,
            },
            approval_wait: Duration::from_secs(g.approval_wait_seconds),
            approval_ttl: Duration::from_secs(g.approval_ttl_seconds.max(1)),
            approval_webhook: g.approval_webhook.clone(),
            audit_arguments: g.audit_arguments,
            approval_elicitation: g.approval_elicitation,
            untrusted_servers: self
                .servers
                .iter()
                .filter(|s| s.untrusted)
                .map(|s| s.name.clone())
                .collect(),
            taint_rule: self.code_mode.taint_rule,
            guardrails: manifold_broker::guardrails::Guardrails {
                mask_secrets: g.mask_secrets,
                max_result_chars: g.max_result_chars,
            },
            audit_retention: (g.audit_retention_days > 0)
                .then(|| Duration::from_secs(g.audit_retention_days.saturating_mul(86_400))),
            audit_commit,
            ..Default::default()
        };
        if let Some(keys) = &g.redact_keys {
            config.redact_keys = keys.iter().map(|k| k.to_lowercase()).collect();
        }
        Ok(config)
    }

    /// Opens the governance store the config names, creating the SQLite data
    /// dir if needed and applying migrations.
    pub async fn open_store(&self) -> anyhow::Result<manifold_store::Store> {
        let url = self.database_url();
        if url.starts_with("sqlite:") && self.store.database_url.is_none() {
            let dir = self.data_dir();
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create data dir {}", dir.display()))?;
        }
        manifold_store::Store::connect(&url)
            .await
            .context("cannot open the governance store")
    }
}

impl PolicySeed {
    pub fn to_new_policy(&self) -> anyhow::Result<manifold_store::NewPolicy> {
        parse_policy(
            &self.principal,
            &self.server,
            &self.tool,
            &self.tier,
            &self.effect,
            self.limit,
            self.window_seconds,
            &self.description,
        )
    }
}

/// A policy rule from its text fields, as the config and the CLI give them.
#[allow(clippy::too_many_arguments)]
pub fn parse_policy(
    principal: &str,
    server: &str,
    tool: &str,
    tier: &str,
    effect: &str,
    limit: Option<u32>,
    window_seconds: Option<u32>,
    description: &str,
) -> anyhow::Result<manifold_store::NewPolicy> {
    use manifold_store::Effect;
    let effect = match effect {
        "allow" => Effect::Allow,
        "deny" => Effect::Deny,
        "require_approval" => Effect::RequireApproval,
        "rate_limit" => match (limit, window_seconds) {
            (Some(limit), Some(window_seconds)) => Effect::RateLimit {
                limit,
                window_seconds,
            },
            _ => bail!("rate_limit needs limit and window_seconds"),
        },
        other => bail!("effect '{other}' (expected allow, deny, require_approval or rate_limit)"),
    };
    Ok(manifold_store::NewPolicy {
        principal: principal.parse()?,
        tier: tier.parse()?,
        server_glob: server.to_string(),
        tool_glob: tool.to_string(),
        effect,
        description: description.to_string(),
    })
}

fn is_loopback(listen: &str) -> bool {
    let host = match listen.rsplit_once(':') {
        Some((host, _)) => host,
        None => listen,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A bare command name is looked up next to the `manifold` binary first (where
/// the fixture servers are built), then on `PATH`; a relative path is taken
/// from the config's folder.
fn resolve_command(command: &str, base: &Path) -> String {
    if command.contains('/') {
        let p = Path::new(command);
        return if p.is_relative() {
            base.join(p).to_string_lossy().into_owned()
        } else {
            command.to_string()
        };
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        let candidate = dir.join(command);
        if candidate.is_file() {
            return candidate.to_string_lossy().into_owned();
        }
    }
    command.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `manifold doctor`'s list: each weakened setting is named, and a
    /// default loopback gateway has only the (default-on) elicitation.
    #[test]
    fn security_warnings_name_each_weakened_setting() {
        let names = |text: &str| -> Vec<&'static str> {
            let config: Config = toml::from_str(text).unwrap();
            config
                .security_warnings()
                .into_iter()
                .map(|(n, _)| n)
                .collect()
        };
        assert_eq!(names(""), ["governance.approval_elicitation"]);
        let weakened = names(
            "[gateway]\nlisten = \"0.0.0.0:8080\"\n[auth]\nrequired = false\n\
             [admin]\nallow_runtime_servers = true\n\
             [code_mode]\nrequire_isolation = false\nseccomp = false\n\
             [governance]\nmask_secrets = false\napproval_elicitation = false",
        );
        assert_eq!(
            weakened,
            [
                "auth.required",
                "admin.allow_runtime_servers",
                "code_mode isolation",
                "code_mode.require_isolation",
                "governance.mask_secrets",
            ]
        );
        assert_eq!(
            names(
                "[code_mode]\nsandbox = \"in_process\"\n[governance]\napproval_elicitation = false"
            ),
            ["code_mode.sandbox"]
        );
        // Auth off is only a warning off loopback.
        assert!(names("[auth]\nrequired = false").len() == 1);
    }

    #[test]
    fn auth_is_on_off_loopback() {
        let config: Config = toml::from_str("").unwrap();
        assert!(!config.auth_required("127.0.0.1:8080"));
        assert!(!config.auth_required("[::1]:8080"));
        assert!(!config.auth_required("localhost:1"));
        assert!(config.auth_required("0.0.0.0:8080"));
        assert!(config.auth_required("192.168.1.4:8080"));
        let config: Config = toml::from_str("[auth]\nrequired = true").unwrap();
        assert!(config.auth_required("127.0.0.1:8080"));
    }

    #[test]
    fn per_principal_credentials_need_oauth_and_a_public_url() {
        let parse = |text: &str| Config::parse(text, PathBuf::from("/tmp"));
        let server = "[[servers]]\nname = \"t\"\nurl = \"https://t.example/mcp\"\ncredentials = \"per_principal\"\n";
        let error = parse(server).unwrap_err();
        assert!(
            format!("{error:#}").contains("needs auth = \"oauth\""),
            "{error:#}"
        );
        let oauth = format!("{server}auth = \"oauth\"\n");
        let error = parse(&oauth).unwrap_err();
        assert!(format!("{error:#}").contains("public_url"), "{error:#}");
        let config = parse(&format!(
            "[gateway]\npublic_url = \"https://gw.example\"\n{oauth}max_principal_connections = 8\n"
        ))
        .unwrap();
        assert_eq!(config.servers[0].max_principal_connections, 8);
        assert_eq!(config.servers[0].principal_idle_seconds, 600);
        let error = parse(&format!(
            "[gateway]\npublic_url = \"https://gw.example\"\n{oauth}max_principal_connections = 0\n"
        ))
        .unwrap_err();
        assert!(format!("{error:#}").contains("at least 1"), "{error:#}");
    }

    #[test]
    fn oidc_needs_the_resource_url_and_says_what_is_wrong() {
        let parse = |text: &str| Config::parse(text, PathBuf::from("/tmp"));
        let error = parse("[auth.oidc]\nissuer = \"https://id.example\"").unwrap_err();
        assert!(format!("{error:#}").contains("resource_url"), "{error:#}");
        let base =
            "[auth]\nresource_url = \"https://gw/mcp\"\n[auth.oidc]\nissuer = \"https://id\"\n";
        let config = parse(base).unwrap();
        let callers = config
            .auth
            .oidc
            .as_ref()
            .unwrap()
            .callers("https://gw/mcp")
            .unwrap();
        assert_eq!(
            callers.scopes.keys().collect::<Vec<_>>(),
            [
                "manifold:admin",
                "manifold:call",
                "manifold:code",
                "manifold:discover"
            ]
        );
        let mapped = parse(&format!(
            "{base}[auth.oidc.scopes]\n\"mcp:all\" = [\"discover\", \"call\"]\n\"mcp:read\" = \"discover\""
        ))
        .unwrap();
        let callers = mapped.auth.oidc.unwrap().callers("https://gw/mcp").unwrap();
        assert_eq!(callers.scopes["mcp:all"].len(), 2);
        let error = parse(&format!("{base}algorithms = [\"HS256\"]")).unwrap_err();
        assert!(format!("{error:#}").contains("symmetric"), "{error:#}");
        let error = parse(&format!("{base}[auth.oidc.scopes]\n\"x\" = \"fly\"")).unwrap_err();
        assert!(format!("{error:#}").contains("fly"), "{error:#}");
    }

    #[test]
    fn policy_seeds_parse_or_say_why() {
        let config: Config = toml::from_str(
            "[[policies]]\neffect = \"rate_limit\"\nlimit = 5\nwindow_seconds = 60\ntier = \"write\"\n\
             [[policies]]\neffect = \"deny\"\nprincipal = \"group:interns\"\nserver = \"prod-*\"",
        )
        .unwrap();
        assert!(config.policies.iter().all(|p| p.to_new_policy().is_ok()));
        let bad = PolicySeed {
            effect: "rate_limit".into(),
            limit: None,
            ..config.policies[0].clone()
        };
        assert!(format!("{:#}", bad.to_new_policy().unwrap_err()).contains("window_seconds"));
        let bad = PolicySeed {
            effect: "maybe".into(),
            ..config.policies[0].clone()
        };
        assert!(format!("{:#}", bad.to_new_policy().unwrap_err()).contains("require_approval"));
    }

    #[test]
    fn parses_the_documented_example() {
        let dir = std::env::temp_dir().join(format!("manifold-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.toml");
        std::fs::write(
            &path,
            r#"
[gateway]
listen = "127.0.0.1:8080"
mode = "auto"
context_window_tokens = 200000
threshold_percent = 2.0

[[servers]]
name = "time"
description = "Current time and timezone conversion"
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]
env = { TZ = "UTC" }
autoconnect = true

[[servers]]
name = "tickets"
description = "Issue tracker"
url = "http://127.0.0.1:9000/mcp"
headers = { Authorization = "Bearer ${TICKETS_TOKEN}" }
"#,
        )
        .unwrap();
        let config = Config::load(&path).unwrap();
        assert_eq!(config.servers.len(), 2);
        assert_eq!(config.gateway.mode, Mode::Auto);
        assert_eq!(
            config.servers[0].cwd.as_deref(),
            Some(std::fs::canonicalize(&dir).unwrap().as_path())
        );
        std::fs::write(&path, "[gateway]\nmode = \"sideways\"\n").unwrap();
        let err = format!("{:#}", Config::load(&path).unwrap_err());
        assert!(err.contains("sideways") || err.contains("mode"), "{err}");
        std::fs::write(&path, "[[servers]]\nname = \"a\"\ncommand = \"x\"\n[[servers]]\nname = \"a\"\ncommand = \"y\"\n").unwrap();
        assert!(format!("{:#}", Config::load(&path).unwrap_err()).contains("twice"));
    }
}
