//! The periodic cleanup of what governance keeps.

use manifold_store::{AuditKind, StoreError, now_ms};

use super::Governance;

impl Governance {
    /// One pass of every cleanup: expired tokens (in bounded batches),
    /// approvals, rate-limit windows, expired tasks (the end row of a
    /// passed-through one nobody saw end), and audit rows past their
    /// retention.
    pub async fn sweep(&self) -> Result<SweepReport, StoreError> {
        let now = now_ms();
        let tokens = self.store.sweep_all_expired(now).await?;
        let approvals = self.store.sweep_expired_approvals(now - 86_400_000).await?;
        let windows = self.store.sweep_rate_limits(now).await?;
        let tasks = self.store.sweep_tasks(now).await?;
        for task in &tasks.unseen {
            self.record_unseen_task_end(task).await;
        }
        let mut audit_rows = 0;
        if let Some(retention) = self.config.audit_retention {
            let before =
                now.saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
            for kind in AuditKind::ALL {
                audit_rows += self.store.sweep_audit(kind, before).await?;
            }
        }
        Ok(SweepReport {
            token_passes: tokens,
            approvals,
            windows,
            tasks: tasks.swept,
            tasks_unseen: tasks.unseen.len() as u64,
            audit_rows,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepReport {
    /// Tokens deleted per pass.
    pub token_passes: Vec<usize>,
    pub approvals: u64,
    /// Audit rows (all three trails) past `audit_retention`.
    pub audit_rows: u64,
    pub windows: u64,
    /// Tasks past their expiry.
    pub tasks: u64,
    /// Of them, passed-through tasks nobody saw end (each got an end row).
    pub tasks_unseen: u64,
}
