//! Durable approvals for calls that a policy holds back.
//!
//! An approval is requested for one principal, one tool and one argument hash
//! ([`crate::hash_arguments`]), decided once by an operator, and consumed at
//! most once, by a call with exactly that principal, tool and argument hash,
//! before it expires. Consumption is a single conditional `UPDATE`, so two
//! gateway processes racing for the same approval cannot both win.

use serde::Serialize;
use serde_json::Value;
use sqlx::{Row, any::AnyRow};

use crate::{Result, Store, StoreError, now_ms, random_id};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatus {
    Pending,
    Approved,
    Denied,
}

impl ApprovalStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalStatus::Pending => "pending",
            ApprovalStatus::Approved => "approved",
            ApprovalStatus::Denied => "denied",
        }
    }

    fn parse(s: &str) -> Result<ApprovalStatus> {
        match s {
            "pending" => Ok(ApprovalStatus::Pending),
            "approved" => Ok(ApprovalStatus::Approved),
            "denied" => Ok(ApprovalStatus::Denied),
            other => Err(StoreError::corrupt("approval status", other)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Approval {
    pub id: String,
    pub principal: String,
    pub tool: String,
    pub args_hash: String,
    /// The arguments with secrets removed, for the operator to review.
    pub redacted_args: Value,
    pub status: ApprovalStatus,
    pub created_at: i64,
    pub expires_at: i64,
    pub decided_at: Option<i64>,
    pub decided_by: Option<String>,
    pub consumed_at: Option<i64>,
}

impl Approval {
    fn from_row(row: &AnyRow) -> Result<Approval> {
        let status: String = row.try_get("status")?;
        let args: String = row.try_get("redacted_args")?;
        Ok(Approval {
            id: row.try_get("id")?,
            principal: row.try_get("principal")?,
            tool: row.try_get("tool")?,
            args_hash: row.try_get("args_hash")?,
            redacted_args: serde_json::from_str(&args)
                .map_err(|_| StoreError::corrupt("approval arguments", args.clone()))?,
            status: ApprovalStatus::parse(&status)?,
            created_at: row.try_get("created_at")?,
            expires_at: row.try_get("expires_at")?,
            decided_at: row.try_get("decided_at")?,
            decided_by: row.try_get("decided_by")?,
            consumed_at: row.try_get("consumed_at")?,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    #[error("no such approval")]
    NotFound,
    #[error("approval expired")]
    Expired,
    #[error("approval was already decided ({0:?})")]
    AlreadyDecided(ApprovalStatus),
    #[error("approval is {0:?}, not approved")]
    NotApproved(ApprovalStatus),
    #[error("approval was already used")]
    AlreadyConsumed,
    #[error("approval is for a different principal, tool or arguments")]
    Mismatch,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for ApprovalError {
    fn from(e: sqlx::Error) -> Self {
        ApprovalError::Store(e.into())
    }
}

const APPROVAL_COLUMNS: &str = "id, principal, tool, args_hash, redacted_args, status, created_at, \
                                expires_at, decided_at, decided_by, consumed_at";

impl Store {
    /// Records a pending approval request. Returns its id.
    pub async fn create_approval(
        &self,
        principal: &str,
        tool: &str,
        args_hash: &str,
        redacted_args: &Value,
        expires_at: i64,
    ) -> Result<String> {
        let id = random_id::<12>("apr_");
        self.query(
            "INSERT INTO approvals (id, principal, tool, args_hash, redacted_args, status, \
             created_at, expires_at) VALUES ($1, $2, $3, $4, $5, 'pending', $6, $7)",
        )
        .bind(&id)
        .bind(principal)
        .bind(tool)
        .bind(args_hash)
        .bind(redacted_args.to_string())
        .bind(now_ms())
        .bind(expires_at)
        .execute(self.pool())
        .await?;
        Ok(id)
    }

    pub async fn get_approval(&self, id: &str) -> Result<Option<Approval>> {
        let sql = format!("SELECT {APPROVAL_COLUMNS} FROM approvals WHERE id = $1");
        let row = self
            .query(&sql)
            .bind(id)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(Approval::from_row).transpose()
    }

    /// Pending requests that have not expired, oldest first.
    pub async fn list_pending(&self) -> Result<Vec<Approval>> {
        let sql = format!(
            "SELECT {APPROVAL_COLUMNS} FROM approvals \
             WHERE status = 'pending' AND expires_at > $1 ORDER BY created_at, id"
        );
        let rows = self
            .query(&sql)
            .bind(now_ms())
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(Approval::from_row).collect()
    }

    /// How many pending requests have not expired.
    pub async fn count_pending(&self) -> Result<u64> {
        let row = self
            .query("SELECT COUNT(*) FROM approvals WHERE status = 'pending' AND expires_at > $1")
            .bind(now_ms())
            .fetch_one(self.pool())
            .await?;
        Ok(row.try_get::<i64, _>(0)?.max(0) as u64)
    }

    /// The newest approval for exactly this principal, tool and argument hash
    /// that could still release a call: pending or approved, unused and
    /// unexpired at `now`. A retried call finds its request here instead of
    /// filing another.
    pub async fn find_open_approval(
        &self,
        principal: &str,
        tool: &str,
        args_hash: &str,
        now: i64,
    ) -> Result<Option<Approval>> {
        let sql = format!(
            "SELECT {APPROVAL_COLUMNS} FROM approvals \
             WHERE principal = $1 AND tool = $2 AND args_hash = $3 AND consumed_at IS NULL \
               AND status IN ('pending', 'approved') AND expires_at > $4 \
             ORDER BY created_at DESC, id DESC LIMIT 1"
        );
        let row = self
            .query(&sql)
            .bind(principal)
            .bind(tool)
            .bind(args_hash)
            .bind(now)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(Approval::from_row).transpose()
    }

    /// Approves or denies a pending, unexpired request, once.
    pub async fn decide_approval(
        &self,
        id: &str,
        approve: bool,
        by: &str,
    ) -> Result<Approval, ApprovalError> {
        let now = now_ms();
        let status = if approve {
            ApprovalStatus::Approved
        } else {
            ApprovalStatus::Denied
        };
        let sql = format!(
            "UPDATE approvals SET status = $2, decided_at = $3, decided_by = $4 \
             WHERE id = $1 AND status = 'pending' AND expires_at > $3 RETURNING {APPROVAL_COLUMNS}"
        );
        let row = self
            .query(&sql)
            .bind(id)
            .bind(status.as_str())
            .bind(now)
            .bind(by)
            .fetch_optional(self.pool())
            .await?;
        if let Some(row) = row {
            let approval = Approval::from_row(&row)?;
            // Calls waiting for it, in any process, look again now.
            self.publish(crate::StoreEvent::ApprovalDecided {
                id: approval.id.clone(),
            })
            .await;
            return Ok(approval);
        }
        let known = self
            .get_approval(id)
            .await?
            .ok_or(ApprovalError::NotFound)?;
        Err(if known.status != ApprovalStatus::Pending {
            ApprovalError::AlreadyDecided(known.status)
        } else {
            ApprovalError::Expired
        })
    }

    /// Uses an approval for one call: succeeds once, for exactly the
    /// principal, tool and argument hash it was requested for, while it is
    /// approved and unexpired at `now`.
    pub async fn consume_approval(
        &self,
        id: &str,
        principal: &str,
        tool: &str,
        args_hash: &str,
        now: i64,
    ) -> Result<(), ApprovalError> {
        let done = self
            .query(
                "UPDATE approvals SET consumed_at = $5 \
                 WHERE id = $1 AND principal = $2 AND tool = $3 AND args_hash = $4 \
                   AND status = 'approved' AND consumed_at IS NULL AND expires_at > $5",
            )
            .bind(id)
            .bind(principal)
            .bind(tool)
            .bind(args_hash)
            .bind(now)
            .execute(self.pool())
            .await?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        // Refused: read the row only to say why.
        let known = self
            .get_approval(id)
            .await?
            .ok_or(ApprovalError::NotFound)?;
        Err(
            if known.principal != principal || known.tool != tool || known.args_hash != args_hash {
                ApprovalError::Mismatch
            } else if known.consumed_at.is_some() {
                ApprovalError::AlreadyConsumed
            } else if known.status != ApprovalStatus::Approved {
                ApprovalError::NotApproved(known.status)
            } else {
                ApprovalError::Expired
            },
        )
    }

    /// Deletes approvals that expired before `before`. Returns how many.
    pub async fn sweep_expired_approvals(&self, before: i64) -> Result<u64> {
        let done = self
            .query("DELETE FROM approvals WHERE expires_at < $1")
            .bind(before)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected())
    }
}
