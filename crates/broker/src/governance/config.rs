//! Governance settings, as the config file gives them.

use std::{collections::BTreeSet, time::Duration};

use manifold_store::{AuditCommit, Effect};

use crate::{guardrails::Guardrails, policy::QuarantineRules};

/// How long audit rows are kept unless `[governance] audit_retention_days`
/// says otherwise.
pub const DEFAULT_AUDIT_RETENTION_DAYS: u64 = 90;

/// Failure rows per minute unless `[governance] failure_rows_per_minute`
/// says otherwise.
pub const DEFAULT_FAILURE_ROWS_PER_MINUTE: u64 = 600;

/// Governance settings, from the config file.
#[derive(Debug, Clone)]
pub struct GovernanceConfig {
    /// What applies when no policy matches: allow, deny or require_approval.
    pub default_effect: Effect,
    pub quarantine: QuarantineRules,
    /// How long a call that needs approval waits for it before answering
    /// `approval_required`.
    pub approval_wait: Duration,
    /// How often a waiting call re-reads its approval.
    pub approval_poll: Duration,
    /// How long an approval request stays open.
    pub approval_ttl: Duration,
    /// POSTed a JSON description of each new approval request.
    pub approval_webhook: Option<String>,
    /// Keep (redacted) arguments in the activity audit.
    pub audit_arguments: bool,
    /// Ask a caller whose client declares elicitation (and can be asked, as
    /// a legacy session can) to approve the call itself, beside the operator.
    pub approval_elicitation: bool,
    /// Argument keys whose values are replaced by `"[redacted]"` wherever
    /// arguments are kept (approvals, audit). Case-insensitive substrings.
    pub redact_keys: Vec<String>,
    /// Servers whose results are untrusted input (web pages, inboxes,
    /// tickets anyone can write).
    pub untrusted_servers: BTreeSet<String>,
    /// After a code-mode run has read from an untrusted server, a write or
    /// destructive call to a different server needs approval.
    pub taint_rule: bool,
    /// Audit rows older than this are deleted by the sweeps; `None` keeps
    /// them forever.
    pub audit_retention: Option<Duration>,
    /// Secret masking and the size limit on results.
    pub guardrails: Guardrails,
    /// Whether a reply waits for its audit row's commit.
    pub audit_commit: AuditCommit,
    /// What a call does while its audit row cannot be made durable.
    pub audit_failure: AuditFailure,
    /// The most failure rows (failed accesses, unknown tools) written per
    /// minute; past it one summary row counts the rest. 0: no ceiling.
    pub failure_rows_per_minute: u64,
    /// How long a task the gateway hands out stays readable (`[gateway]
    /// task_ttl_seconds`).
    pub task_ttl: Duration,
}

impl Default for GovernanceConfig {
    fn default() -> Self {
        GovernanceConfig {
            default_effect: Effect::Allow,
            quarantine: QuarantineRules {
                new_tools: false,
                changed_tools: true,
            },
            approval_wait: Duration::from_secs(30),
            approval_poll: Duration::from_millis(200),
            approval_ttl: Duration::from_secs(3600),
            approval_webhook: None,
            audit_arguments: false,
            approval_elicitation: true,
            redact_keys: [
                "password",
                "secret",
                "token",
                "authorization",
                "api_key",
                "apikey",
            ]
            .map(String::from)
            .to_vec(),
            untrusted_servers: BTreeSet::new(),
            taint_rule: true,
            audit_retention: Some(Duration::from_secs(DEFAULT_AUDIT_RETENTION_DAYS * 86_400)),
            guardrails: Default::default(),
            audit_commit: AuditCommit::Sync,
            failure_rows_per_minute: DEFAULT_FAILURE_ROWS_PER_MINUTE,
            audit_failure: AuditFailure::Refuse,
            task_ttl: Duration::from_secs(3600),
        }
    }
}

/// What a call does while audit rows cannot be made durable (committed, or
/// journaled with room left in the journal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuditFailure {
    /// It is answered `audit_unavailable` and not executed.
    #[default]
    Refuse,
    /// It goes on without its row; the writer logs the error.
    Log,
}
