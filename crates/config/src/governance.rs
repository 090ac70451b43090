//! How calls are governed and where that state lives: `[governance]`,
//! `[[policies]]` and `[store]`.

use std::path::PathBuf;

use anyhow::bail;
use manifold_store::{AuditCommit, Effect, NewPolicy};
use serde::Deserialize;

/// How long audit rows are kept when `audit_retention_days` is not set; the
/// broker's own default is the same (a test in the binary holds them equal).
pub const DEFAULT_AUDIT_RETENTION_DAYS: u64 = 90;

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
    #[serde(default = "crate::yes")]
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
    #[serde(default = "crate::yes")]
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
    #[serde(default = "crate::yes")]
    pub approval_elicitation: bool,
    /// Argument keys (case-insensitive substrings) whose values are redacted.
    pub redact_keys: Option<Vec<String>>,
    /// `refuse` (default): while audit rows cannot be made durable, calls
    /// are answered `audit_unavailable` and not executed. `log`: they go on
    /// without their rows, which the gateway logs.
    #[serde(default = "default_audit_failure")]
    pub audit_failure: String,
    /// The most failure rows (failed accesses, unknown tools) the audit
    /// takes per minute; past it one row says how many were suppressed.
    /// 0: no ceiling.
    #[serde(default = "default_failure_rows_per_minute")]
    pub failure_rows_per_minute: u64,
    /// Seconds between cleanup passes (expired tokens, approvals, windows).
    #[serde(default = "default_sweep_interval")]
    pub sweep_interval_seconds: u64,
}

impl Default for GovernanceSection {
    fn default() -> Self {
        toml::from_str("").expect("empty governance config is valid")
    }
}

impl GovernanceSection {
    /// `default_effect`, checked.
    pub fn default_effect(&self) -> anyhow::Result<Effect> {
        Ok(match self.default_effect.as_str() {
            "allow" => Effect::Allow,
            "deny" => Effect::Deny,
            "require_approval" => Effect::RequireApproval,
            other => bail!("default_effect '{other}' (expected allow, deny or require_approval)"),
        })
    }

    /// `audit_failure`, checked: whether a call is refused (true) while
    /// its audit row cannot be made durable.
    pub fn audit_failure_refuses(&self) -> anyhow::Result<bool> {
        Ok(match self.audit_failure.as_str() {
            "refuse" => true,
            "log" => false,
            other => bail!("governance.audit_failure '{other}' (expected refuse or log)"),
        })
    }

    /// `audit_commit`, checked.
    pub fn audit_commit(&self) -> anyhow::Result<AuditCommit> {
        Ok(match self.audit_commit.as_str() {
            "sync" => AuditCommit::Sync,
            "async" => AuditCommit::Async,
            other => bail!("governance.audit_commit '{other}' (expected sync or async)"),
        })
    }
}

/// The broker's own default is the same (a test in the binary holds them
/// equal).
pub const DEFAULT_FAILURE_ROWS_PER_MINUTE: u64 = 600;

fn default_failure_rows_per_minute() -> u64 {
    DEFAULT_FAILURE_ROWS_PER_MINUTE
}

fn default_audit_failure() -> String {
    "refuse".into()
}

fn default_audit_commit() -> String {
    "sync".into()
}

fn default_audit_retention_days() -> u64 {
    DEFAULT_AUDIT_RETENTION_DAYS
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

impl PolicySeed {
    pub fn to_new_policy(&self) -> anyhow::Result<NewPolicy> {
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
) -> anyhow::Result<NewPolicy> {
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
    Ok(NewPolicy {
        principal: principal.parse()?,
        tier: tier.parse()?,
        server_glob: server.to_string(),
        tool_glob: tool.to_string(),
        effect,
        description: description.to_string(),
    })
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
