//! The audit rows of what the broker decided and did, through the store's
//! audit writer (`AuditWriter`): a request begins with its access row, a
//! call marks its row as coming, and each row is recorded. Arguments are
//! kept only redacted, and only when `audit_arguments` is on.
//!
//! What a row that cannot be made durable does to its request is decided
//! in one place, [`audited`].

use std::time::Duration;

use manifold_store::{
    AccessEvent, ActivityEvent, AuditError, AuditRow, CallOutcome, Decision, DiscoveryEvent,
    RequestRows, RowComing, hash_argument_object, now_ms,
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
        let mut details = extra;
        if self.config.audit_arguments {
            details["arguments"] = self.redact(&Value::Object(arguments.clone()));
        }
        let event = ActivityEvent {
            at: now_ms(),
            principal: caller.name.clone(),
            token_id: caller.token_id().map(str::to_string),
            tool: tool.to_string(),
            args_hash,
            decision,
            approval_id,
            outcome,
            latency_ms: u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
            bytes_in: manifold_upstream::json_len(arguments) as u64,
            bytes_out,
            details,
        };
        self.record_row(AuditRow::Activity(event)).await;
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
