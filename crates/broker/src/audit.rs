//! The broker's last stage: the audit rows of what it decided and did. Rows
//! go to the store's group-committing writer; arguments are kept only
//! redacted, and only when `audit_arguments` is on.

use std::time::Duration;

use manifold_store::{
    ActivityEvent, AuditRow, CallOutcome, Decision, DiscoveryEvent, hash_argument_object, now_ms,
};
use rmcp::model::JsonObject;
use serde_json::{Value, json};

use crate::{Caller, Governance, Refusal};

impl Governance {
    /// Returns once every audit row recorded so far is committed; a clean
    /// stop calls it last.
    pub async fn flush_audit(&self) {
        self.audit.flush().await;
    }

    pub(crate) async fn record_discovery(&self, caller: &Caller, names: &[&str], what: &str) {
        let event = DiscoveryEvent::new(now_ms(), caller.name.clone(), caller.token_id(), names)
            .details(json!({ "kind": what }));
        self.audit.record(AuditRow::Discovery(event)).await;
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
        self.audit.record(AuditRow::Activity(event)).await;
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
