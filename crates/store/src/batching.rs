//! What both audit writers share: the bounds on queued and batched rows, how
//! long a row nobody waits for lingers, what a waiting caller is told, and
//! the folding of identical access failures.

use std::{collections::HashMap, time::Duration};

use serde_json::json;
use tokio::sync::oneshot;

use crate::{AccessOutcome, AuditRow};

/// The most rows one transaction of the writer task carries.
pub const MAX_BATCH: usize = 512;
/// Rows that may wait for the writer before callers are made to wait.
pub const QUEUE_CAPACITY: usize = 8192;
/// How long a row nobody waits for may wait for others to share its commit.
pub const LINGER: Duration = Duration::from_millis(5);

/// Why an audit row was not made durable. The writer logs the database's
/// own error where it happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuditError {
    /// The database refused the row, or a row committed with it.
    #[error("the audit row was not recorded")]
    NotRecorded,
    /// The writer stopped before it wrote the row.
    #[error("the audit writer has stopped")]
    Stopped,
}

/// Where a caller waiting for a commit hears how it went.
pub(crate) type Done = oneshot::Sender<Result<(), AuditError>>;

/// Waits for the answer `done` sends.
pub(crate) async fn answer(
    done: oneshot::Receiver<Result<(), AuditError>>,
) -> Result<(), AuditError> {
    done.await.unwrap_or(Err(AuditError::Stopped))
}

/// Identical access failures (the same claimed token id and reason, e.g. a
/// client retrying a revoked token) become one row whose `details.count`
/// says how many there were; everything else keeps its order.
pub(crate) fn fold_access_failures(rows: Vec<AuditRow>) -> Vec<AuditRow> {
    let mut out: Vec<AuditRow> = Vec::with_capacity(rows.len());
    let mut seen: HashMap<(Option<String>, Option<String>), (usize, u64)> = HashMap::new();
    for row in rows {
        if let AuditRow::Access(event) = &row
            && event.outcome == AccessOutcome::Failure
        {
            let key = (event.token_id.clone(), event.reason.clone());
            if let Some((at, count)) = seen.get_mut(&key) {
                *count += 1;
                if let AuditRow::Access(first) = &mut out[*at] {
                    first.details["count"] = json!(*count);
                }
                continue;
            }
            seen.insert(key, (out.len(), 1));
        }
        out.push(row);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AccessEvent;

    #[test]
    fn identical_access_failures_fold_into_one_row_with_a_count() {
        let fail =
            |id: &str, reason: &str| AuditRow::Access(AccessEvent::failure(1, Some(id), reason));
        let rows = vec![
            fail("a", "revoked"),
            AuditRow::Access(AccessEvent::success(1, "token:a", Some("a"))),
            fail("a", "revoked"),
            fail("b", "revoked"),
            fail("a", "revoked"),
            fail("a", "expired"),
        ];
        let folded = fold_access_failures(rows);
        let summary: Vec<(String, Option<u64>)> = folded
            .iter()
            .map(|row| match row {
                AuditRow::Access(e) => (
                    format!(
                        "{}:{}",
                        e.token_id.as_deref().unwrap_or(""),
                        e.reason.as_deref().unwrap_or("ok")
                    ),
                    e.details.get("count").and_then(|c| c.as_u64()),
                ),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("a:revoked".to_string(), Some(3)),
                ("a:ok".to_string(), None),
                ("b:revoked".to_string(), None),
                ("a:expired".to_string(), None),
            ]
        );
    }
}
