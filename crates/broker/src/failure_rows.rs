//! The ceiling on failure rows: what strangers can make the audit write
//! per minute, whatever they vary.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use manifold_store::{AccessEvent, AuditRow, AuditWriter, now_ms};
use serde_json::json;

/// The ceiling on failure rows: at most `per_minute` in each minute of the
/// clock, for the whole process. A stranger with garbage bearers or made-up
/// tool names can make each request fail differently, so folding identical
/// rows alone does not bound them.
pub(crate) struct FailureRows {
    per_minute: u64,
    /// A minute, but for tests.
    window_ms: i64,
    window: Mutex<Window>,
}

#[derive(Default)]
struct Window {
    /// The minute (ms since the epoch / the window) being counted.
    minute: i64,
    written: u64,
    /// Rows suppressed this minute, shared with the task that writes the
    /// minute's summary row as it ends.
    suppressed: Option<Arc<AtomicU64>>,
}

const MINUTE_MS: i64 = 60_000;

impl FailureRows {
    /// `per_minute` 0: no ceiling.
    pub(crate) fn new(per_minute: u64) -> FailureRows {
        FailureRows {
            per_minute,
            window_ms: MINUTE_MS,
            window: Mutex::default(),
        }
    }

    /// Whether another failure row may be written now. The first one
    /// suppressed in a minute arranges that minute's summary row.
    pub(crate) fn admit(&self, audit: &AuditWriter) -> bool {
        if self.per_minute == 0 {
            return true;
        }
        let now = now_ms();
        let minute = now.div_euclid(self.window_ms);
        let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        if window.minute != minute {
            *window = Window {
                minute,
                ..Window::default()
            };
        }
        if window.written < self.per_minute {
            window.written += 1;
            return true;
        }
        if let Some(suppressed) = &window.suppressed {
            suppressed.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let suppressed = Arc::new(AtomicU64::new(1));
        window.suppressed = Some(Arc::clone(&suppressed));
        let audit = audit.clone();
        let end = (minute + 1) * self.window_ms;
        let wait = Duration::from_millis(u64::try_from(end - now).unwrap_or(0));
        let window_ms = self.window_ms;
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let details = json!({
                "suppressed": suppressed.load(Ordering::Relaxed),
                "from": end - window_ms,
                "until": end,
            });
            let event = AccessEvent::failure(end, None, "failure_rows_suppressed").details(details);
            if let Err(error) = audit.record(AuditRow::Access(event)).await {
                tracing::warn!(%error, "audit: the suppressed failure rows' summary not recorded");
            }
        });
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use manifold_store::{AuditCommit, AuditKind, Store};

    /// Past the ceiling rows are counted, not written, and one summary row
    /// says how many as the window ends.
    #[tokio::test]
    async fn past_the_ceiling_failure_rows_are_counted_in_one_summary_row() {
        let store = Store::connect("sqlite::memory:").await.unwrap();
        let audit = AuditWriter::start(store.clone(), AuditCommit::Sync);
        let ceiling = FailureRows {
            window_ms: 2_000,
            ..FailureRows::new(3)
        };
        // Start at the beginning of a window, so all ten fall in one.
        let into = now_ms().rem_euclid(2_000);
        tokio::time::sleep(Duration::from_millis(u64::try_from(2_000 - into).unwrap())).await;
        let admitted: Vec<bool> = (0..10).map(|_| ceiling.admit(&audit)).collect();
        assert_eq!(admitted.iter().filter(|a| **a).count(), 3, "{admitted:?}");
        assert!(admitted[..3].iter().all(|a| *a));
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        audit.flush().await.unwrap();
        let rows = store.audit_export(AuditKind::Access, 0).await.unwrap();
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0]["reason"], "failure_rows_suppressed");
        assert_eq!(rows[0]["details"]["suppressed"], 7);
    }
}
