//! Calls waiting for an operator's decision.

use manifold_store::{Approval, ApprovalError, Store};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::{AdminError, Result};

/// An approval request.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ApprovalInfo {
    pub id: String,
    /// Who asked: `token:<id>` or `anonymous`.
    pub principal: String,
    /// The qualified tool name.
    pub tool: String,
    pub args_hash: String,
    /// The arguments, secrets redacted as configured.
    #[schema(value_type = Object)]
    pub redacted_args: Value,
    /// `pending`, `approved` or `denied`.
    pub status: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub decided_at: Option<i64>,
    pub decided_by: Option<String>,
    pub consumed_at: Option<i64>,
}

impl From<Approval> for ApprovalInfo {
    fn from(a: Approval) -> Self {
        ApprovalInfo {
            id: a.id,
            principal: a.principal,
            tool: a.tool,
            args_hash: a.args_hash,
            redacted_args: a.redacted_args,
            status: a.status.as_str().to_string(),
            created_at: a.created_at,
            expires_at: a.expires_at,
            decided_at: a.decided_at,
            decided_by: a.decided_by,
            consumed_at: a.consumed_at,
        }
    }
}

pub async fn pending_approvals(store: &Store) -> Result<Vec<ApprovalInfo>> {
    Ok(store
        .list_pending()
        .await?
        .into_iter()
        .map(ApprovalInfo::from)
        .collect())
}

/// Approves or denies; the waiting call sees it at its next poll.
/// `decider` is the gateway principal deciding (the admin API, the
/// console): it may never approve a request it made itself. The CLI is the
/// host operator's path and passes `None`, recording `by`.
pub async fn decide_approval(
    store: &Store,
    id: &str,
    approve: bool,
    by: &str,
    decider: Option<&str>,
) -> Result<ApprovalInfo> {
    if approve
        && let Some(decider) = decider
        && let Some(request) = store.get_approval(id).await?
        && request.principal == decider
    {
        return Err(AdminError::Forbidden(format!(
            "'{decider}' requested approval {id} and cannot approve it; another operator must"
        )));
    }
    match store.decide_approval(id, approve, by).await {
        Ok(approval) => Ok(approval.into()),
        Err(ApprovalError::NotFound) => {
            Err(AdminError::NotFound(format!("no such approval '{id}'")))
        }
        Err(ApprovalError::Store(e)) => Err(e.into()),
        Err(e) => Err(AdminError::Conflict(e.to_string())),
    }
}
