//! Why a request was not forwarded, as the caller and the audit see it.

use manifold_store::{Action, ApprovalError, Decision, StoreError};
use serde_json::{Value, json};

use crate::policy::QuarantineReason;

/// Why a call was not forwarded. Each maps to a structured tool error.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("the gateway token is no longer valid ({0})")]
    Unauthenticated(&'static str),
    #[error("this token may not {0}")]
    ActionNotAllowed(Action),
    #[error("denied by {}", policy.as_deref().unwrap_or("the default policy"))]
    Denied { policy: Option<String> },
    #[error("tool is quarantined ({}) until an operator approves it", reason.as_str())]
    Quarantined { reason: QuarantineReason },
    #[error("rate limit reached; retry after {retry_after_ms} ms")]
    RateLimited { policy: String, retry_after_ms: u64 },
    #[error("approval {approval_id} is pending{}; retry the same call once an operator approves it", reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default())]
    ApprovalRequired {
        approval_id: String,
        expires_at: i64,
        /// Why this call needs one when policy alone would not ask.
        reason: Option<String>,
    },
    #[error("approval {approval_id} was denied")]
    ApprovalDenied { approval_id: String },
    #[error("approval refused: {0}")]
    Approval(ApprovalError),
    #[error(
        "{max} of this caller's tasks are still working ([gateway] max_tasks_per_principal); \
         wait for one to end or cancel one, then call again"
    )]
    TooManyTasks { max: u64 },
    #[error("governance store unavailable: {0}")]
    Store(#[from] StoreError),
}

impl Refusal {
    /// A short machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Unauthenticated(_) => "unauthenticated",
            Refusal::ActionNotAllowed(_) => "action_not_allowed",
            Refusal::Denied { .. } => "denied",
            Refusal::Quarantined { .. } => "quarantined",
            Refusal::RateLimited { .. } => "rate_limited",
            Refusal::ApprovalRequired { .. } => "approval_required",
            Refusal::ApprovalDenied { .. } => "approval_denied",
            Refusal::Approval(_) => "approval_refused",
            Refusal::TooManyTasks { .. } => "too_many_tasks",
            Refusal::Store(_) => "governance_unavailable",
        }
    }

    /// The structured body of the tool error the caller gets.
    pub fn to_json(&self) -> Value {
        let mut out = json!({ "error": self.code(), "message": self.to_string() });
        match self {
            Refusal::RateLimited {
                policy,
                retry_after_ms,
            } => {
                out["retry_after_ms"] = json!(retry_after_ms);
                out["policy"] = json!(policy);
            }
            Refusal::ApprovalRequired {
                approval_id,
                expires_at,
                reason,
            } => {
                out["approval_id"] = json!(approval_id);
                out["expires_at"] = json!(expires_at);
                if let Some(reason) = reason {
                    out["reason"] = json!(reason);
                }
                out["retry"] = json!(
                    "Ask an operator to approve it (manifold approvals approve ID), then repeat \
                     the same call with the same arguments."
                );
            }
            Refusal::ApprovalDenied { approval_id } => out["approval_id"] = json!(approval_id),
            Refusal::Denied { policy } => out["policy"] = json!(policy),
            Refusal::Quarantined { reason } => out["reason"] = json!(reason.as_str()),
            _ => {}
        }
        out
    }

    pub(crate) fn decision(&self) -> Decision {
        match self {
            Refusal::RateLimited { .. } | Refusal::TooManyTasks { .. } => Decision::RateLimited,
            Refusal::ApprovalRequired { .. } => Decision::ApprovalRequired,
            _ => Decision::Denied,
        }
    }
}
