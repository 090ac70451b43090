//! The audit rows of what the broker decided and did, through the store's
//! audit writer (`AuditWriter`): a request begins with its access row, a
//! call marks its row as coming, and each row is recorded. Arguments are
//! kept only redacted, and only when `audit_arguments` is on.
//!
//! What a row that cannot be made durable does to its request is decided
//! in one place, [`audited`].

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use manifold_store::{
    AccessEvent, ActivityEvent, AuditError, AuditRow, AuditWriter, CallOutcome, Decision,
    DiscoveryEvent, MAX_STORED_NAME_BYTES, RequestRows, RowComing, cut_text, hash_argument_object,
    now_ms, sha256_hex,
};
use rmcp::model::JsonObject;
use serde_json::{Value, json};

use crate::governance::{Governance, caller::Caller, refusal::Refusal};

/// A row that could not be made durable: the writer has logged the
/// database's error, and the request goes on without it.
fn audited<T>(written: Result<T, AuditError>) -> Option<T> {
    match written {
        Ok(done) => Some(done),
        Err(error) => {
            tracing::debug!(%error, "audit: the request goes on without its row");
            None
        }
    }
}

impl Governance {
    /// Returns once every audit row recorded so far is committed; a clean
    /// stop calls it last.
    pub async fn flush_audit(&self) {
        audited(self.audit.flush().await);
    }

    /// Begins a request with its access row; the request keeps the guard
    /// until it is answered.
    pub(crate) async fn begin_request(&self, access: AccessEvent) -> RequestRows {
        audited(self.audit.begin_request(access).await).unwrap_or_default()
    }

    /// Begins a call whose row is on its way; the call keeps the guard
    /// until its row is recorded.
    pub(crate) fn begin_call(&self) -> RowComing {
        audited(self.audit.begin_call()).unwrap_or_default()
    }

    pub(crate) async fn record_row(&self, row: AuditRow) {
        audited(self.audit.record(row).await);
    }

    /// Records a row that strangers can cause (a failed access, an
    /// unknown tool) unless this minute's ceiling is reached; past it the
    /// row is counted, and one summary row says how many were suppressed.
    pub(crate) async fn record_failure_row(&self, row: AuditRow) {
        if self.failure_rows.admit(&self.audit) {
            self.record_row(row).await;
        }
    }

    pub(crate) async fn record_discovery(&self, caller: &Caller, names: &[&str], what: &str) {
        let event = DiscoveryEvent::new(now_ms(), caller.name.clone(), caller.token_id(), names)
            .details(json!({ "kind": what }));
        self.record_row(AuditRow::Discovery(event)).await;
    }

    /// Records what a search showed (its hits, not the whole visible set).
    pub async fn record_search(&self, caller: &Caller, hits: &[&str]) {
        self.record_discovery(caller, hits, "search").await;
    }

    /// `value` with the values of secret-looking keys replaced.
    pub fn redact(&self, value: &Value) -> Value {
        match value {
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| {
                        let lower = k.to_lowercase();
                        if self
                            .config
                            .redact_keys
                            .iter()
                            .any(|r| lower.contains(r.as_str()))
                        {
                            (k.clone(), json!("[redacted]"))
                        } else {
                            (k.clone(), self.redact(v))
                        }
                    })
                    .collect(),
            ),
            Value::Array(items) => Value::Array(items.iter().map(|v| self.redact(v)).collect()),
            other => other.clone(),
        }
    }

    /// One activity row for a call, forwarded or not.
    #[allow(clippy::too_many_arguments)]
    pub async fn record_call(
        &self,
        caller: &Caller,
        tool: &str,
        arguments: &JsonObject,
        args_hash: String,
        decision: Decision,
        approval_id: Option<String>,
        outcome: CallOutcome,
        latency: Duration,
        bytes_out: u64,
        extra: Value,
    ) {
        let row = self.call_row(
            caller,
            tool,
            arguments,
            args_hash,
            decision,
            approval_id,
            outcome,
            latency,
            bytes_out,
            extra,
        );
        self.record_row(row).await;
    }

    /// The row of a call naming a tool the caller's view lacks: a failure
    /// row, under the ceiling.
    pub(crate) async fn record_unknown_tool(
        &self,
        caller: &Caller,
        name: &str,
        arguments: &JsonObject,
        latency: Duration,
    ) {
        let row = self.call_row(
            caller,
            name,
            arguments,
            hash_argument_object(arguments),
            Decision::Denied,
            None,
            CallOutcome::NotForwarded,
            latency,
            0,
            json!({ "refusal": "unknown_tool", "kind": "tools/call" }),
        );
        self.record_failure_row(row).await;
    }

    /// A call's activity row. A tool name longer than
    /// [`MAX_STORED_NAME_BYTES`] is cut, with its length and SHA-256 kept.
    #[allow(clippy::too_many_arguments)]
    fn call_row(
        &self,
        caller: &Caller,
        tool: &str,
        arguments: &JsonObject,
        args_hash: String,
        decision: Decision,
        approval_id: Option<String>,
        outcome: CallOutcome,
        latency: Duration,
        bytes_out: u64,
        extra: Value,
    ) -> AuditRow {
        let mut details = extra;
        if self.config.audit_arguments {
            details["arguments"] = self.redact(&Value::Object(arguments.clone()));
        }
        let stored = cut_text(tool, MAX_STORED_NAME_BYTES);
        if stored.len() < tool.len() {
            details["tool_bytes"] = json!(tool.len());
            details["tool_sha256"] = json!(sha256_hex(tool));
        }
        let event = ActivityEvent {
            at: now_ms(),
            principal: caller.name.clone(),
            token_id: caller.token_id().map(str::to_string),
            tool: stored.to_string(),
            args_hash,
            decision,
            approval_id,
            outcome,
            latency_ms: u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
            bytes_in: manifold_upstream::json_len(arguments) as u64,
            bytes_out,
            details,
        };
        AuditRow::Activity(event)
    }

    /// Records a refused request: its kind (`tools/call`, `prompts/get`,
    /// `enable_server`, ...) and what it named (a qualified tool or prompt
    /// name, `server__*` for a server's resources).
    pub async fn record_refusal(
        &self,
        caller: &Caller,
        kind: &str,
        tool: &str,
        arguments: &JsonObject,
        refusal: &Refusal,
    ) {
        let approval_id = match refusal {
            Refusal::ApprovalRequired { approval_id, .. }
            | Refusal::ApprovalDenied { approval_id } => Some(approval_id.clone()),
            _ => None,
        };
        self.record_call(
            caller,
            tool,
            arguments,
            hash_argument_object(arguments),
            refusal.decision(),
            approval_id,
            CallOutcome::NotForwarded,
            Duration::ZERO,
            0,
            json!({ "refusal": refusal.code(), "kind": kind }),
        )
        .await;
    }
}

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
    fn admit(&self, audit: &AuditWriter) -> bool {
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
            audited(audit.record(AuditRow::Access(event)).await);
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
