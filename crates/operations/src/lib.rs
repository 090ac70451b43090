//! What an operator can do to the governance store: tokens, policies, tool
//! approval and quarantine, approvals and the audit trails, as plain
//! functions over a [`Store`](manifold_store::Store). The admin API, the
//! console and the `manifold` CLI all call these, so each operation has one
//! implementation; handlers and commands only parse input and render output.
//! It depends on the store alone, so the CLI reaches these without linking
//! the HTTP server. The operations on a running gateway (servers, tools in
//! the catalog, search) are `manifold_server::admin::ops`.

mod approvals;
mod audit;
mod policies;
mod time;
mod tokens;
mod tools;

use manifold_store::StoreError;

pub use approvals::{ApprovalInfo, decide_approval, pending_approvals};
pub use audit::{AuditRow, audit_export, audit_kinds, audit_tail};
pub use policies::{
    PolicyInfo, PolicyInput, create_policy, delete_policy, effect_name, list_policies, new_policy,
    policy_info, principal_text, tier_text, update_policy,
};
pub use time::{format_ms, parse_duration, parse_since};
pub use tokens::{
    CreateToken, CreatedToken, TokenInfo, create_token, list_tokens, revoke_token, token_info,
};
pub use tools::{HASH_PREFIX, ToolAction, tool_action};

/// Why an admin operation failed; the API maps each kind to a status code.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// Refused whoever asks the same way (a decider approving its own request).
    #[error("{0}")]
    Forbidden(String),
    /// An upstream server failed (the operations on a running gateway).
    #[error("{0}")]
    Upstream(String),
    #[error("the store is unavailable: {0}")]
    Store(StoreError),
}

impl From<StoreError> for AdminError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Invalid { .. } => AdminError::Invalid(e.to_string()),
            StoreError::NotFound { .. } => AdminError::NotFound(e.to_string()),
            StoreError::Conflict(_) => AdminError::Conflict(e.to_string()),
            other => AdminError::Store(other),
        }
    }
}

pub type Result<T, E = AdminError> = std::result::Result<T, E>;
