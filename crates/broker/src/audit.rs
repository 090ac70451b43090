//! The audit rows of what the broker decided and did, through the store's
//! audit writer (`AuditWriter`): a request begins with its access row, a
//! call marks its row as coming, and each row is recorded. Arguments are
//! kept only redacted, and only when `audit_arguments` is on.
//!
//! What a row that cannot be made durable does to its request is decided
//! in one place, `Governance::audited`.

use std::{sync::atomic::Ordering, time::Duration};

use manifold_catalog::CatalogTool;
use manifold_store::{
    AccessEvent, ActivityEvent, AuditCommit, AuditError, AuditRow, CallOutcome, Decision,
    DiscoveryEvent, MAX_STORED_NAME_BYTES, RequestRows, RowComing, UnseenTaskEnd, cut_text,
    hash_argument_object, now_ms, sha256_hex,
};
use rmcp::model::JsonObject;
use serde_json::{Value, json};

use crate::governance::{Governance, caller::Caller, config::AuditFailure, refusal::Refusal};

/// A call's audit row cannot be made durable, and `[governance]
/// audit_failure = "refuse"`: the call is not executed, or (its row failing
/// after it ran) its answer is withheld.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the audit trail cannot be written, so calls are refused until it can \
     (governance.audit_failure = \"refuse\")"
)]
pub struct AuditUnavailable;

impl AuditUnavailable {
    /// `data.code` of the JSON-RPC error that answers such a call.
    pub const CODE: &'static str = "audit_unavailable";
}

impl Governance {
    /// Judges what the audit writer said about a row: the one place an
    /// audit failure is decided. With `audit_failure = "log"` the request
    /// goes on without its row (the writer has logged the database's
    /// error); with `"refuse"` the audit is marked unavailable, and calls
    /// are refused until a row is durable again. With `audit_commit =
    /// "async"` no reply waits for its row, so failures are only logged.
    fn audited<T>(&self, written: Result<T, AuditError>) -> Result<Option<T>, AuditUnavailable> {
        let refuses = self.config.audit_failure == AuditFailure::Refuse
            && self.config.audit_commit == AuditCommit::Sync;
        match written {
            Ok(done) => Ok(Some(done)),
            Err(error) if !refuses => {
                tracing::debug!(%error, "audit: the request goes on without its row");
                Ok(None)
            }
            Err(error) => {
                if !self.audit_down.swap(true, Ordering::AcqRel) {
                    tracing::error!(%error, "audit rows cannot be made durable: calls are refused until they can");
                }
                Err(AuditUnavailable)
            }
        }
    }

    /// A row was made durable: the audit is available (again).
    fn durable(&self) {
        if self.audit_down.swap(false, Ordering::AcqRel) {
            tracing::info!("audit rows are durable again: calls are executed");
        }
    }

    /// Whether rows could not be made durable at the last try (with
    /// `audit_failure = "refuse"`); `/readyz` and the admin API show it.
    pub fn audit_unavailable(&self) -> bool {
        self.audit_down.load(Ordering::Acquire)
    }

    /// Before a call runs: while the audit is unavailable, one row (the
    /// caller's access, marked `"audit": "resumed"`) must be made durable
    /// first, so calls recover by themselves once writing works again.
    pub(crate) async fn audit_ready(&self, caller: &Caller) -> Result<(), AuditUnavailable> {
        if !self.audit_unavailable() {
            return Ok(());
        }
        let event = AccessEvent::success(now_ms(), caller.name.clone(), caller.token_id())
            .details(json!({ "audit": "resumed" }));
        self.record_row(AuditRow::Access(event)).await
    }

    /// Returns once every audit row recorded so far is committed; a clean
    /// stop calls it last.
    pub async fn flush_audit(&self) {
        let _judged = self.audited(self.audit.flush().await);
    }

    /// Begins a request with its access row; the request keeps the guard
    /// until it is answered. The row is only queued: its failure is judged
    /// with the request's own row.
    pub(crate) async fn begin_request(&self, access: AccessEvent) -> RequestRows {
        self.audit.begin_request(access).await.unwrap_or_default()
    }

    /// Begins a call whose row is on its way; the call keeps the guard
    /// until its row is recorded.
    pub(crate) fn begin_call(&self) -> RowComing {
        self.audit.begin_call().unwrap_or_default()
    }

    /// Records `row`; an error means it is not durable and the audit is
    /// unavailable (`audit_failure = "refuse"`).
    pub(crate) async fn record_row(&self, row: AuditRow) -> Result<(), AuditUnavailable> {
        let written = self.audit.record(row).await;
        if written.is_ok() && self.config.audit_commit == AuditCommit::Sync {
            self.durable();
        }
        self.audited(written).map(drop)
    }

    /// Records `row`, whose request is answered either way (a refusal, a
    /// listing): a failure only marks the audit unavailable.
    async fn record_other(&self, row: AuditRow) {
        let _judged = self.record_row(row).await;
    }

    /// Records a row that strangers can cause (a failed access, an
    /// unknown tool) unless this minute's ceiling is reached; past it the
    /// row is counted, and one summary row says how many were suppressed.
    pub(crate) async fn record_failure_row(&self, row: AuditRow) {
        if self.failure_rows.admit(&self.audit) {
            self.record_other(row).await;
        }
    }

    pub(crate) async fn record_discovery(&self, caller: &Caller, names: &[&str], what: &str) {
        let event = DiscoveryEvent::new(now_ms(), caller.name.clone(), caller.token_id(), names)
            .details(json!({ "kind": what }));
        self.record_other(AuditRow::Discovery(event)).await;
    }

    /// The end row of a passed-through task the sweep deleted before any
    /// `tasks/get` showed it ended: every task's creation row has its end.
    pub(crate) async fn record_unseen_task_end(&self, task: &UnseenTaskEnd) {
        let arguments = JsonObject::from_iter([("taskId".to_string(), json!(task.id))]);
        let row = self.call_row(
            (&task.principal, task.token_id.as_deref()),
            &task.tool,
            &arguments,
            hash_argument_object(&arguments),
            Decision::Allowed,
            None,
            CallOutcome::Error,
            Duration::ZERO,
            0,
            json!({
                "kind": "tasks",
                "task": task.id,
                "status": "expired",
                "message": "the task expired before a tasks/get showed it ended; \
                            how it ended is not known",
            }),
        );
        self.record_other(row).await;
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
    ) -> Result<(), AuditUnavailable> {
        let row = self.call_row(
            (&caller.name, caller.token_id()),
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
        self.record_row(row).await
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
            (&caller.name, caller.token_id()),
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

    /// A call's activity row, for the principal and token that made it. A
    /// tool name longer than [`MAX_STORED_NAME_BYTES`] is cut, with its
    /// length and SHA-256 kept.
    #[allow(clippy::too_many_arguments)]
    fn call_row(
        &self,
        (principal, token_id): (&str, Option<&str>),
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
            principal: principal.to_string(),
            token_id: token_id.map(str::to_string),
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
        self.record_refusal_with(caller, kind, tool, arguments, refusal, json!({}))
            .await
    }

    /// A refused tool call's row, with the tool's upstream identity when
    /// the operator renamed it.
    pub(crate) async fn record_tool_refusal(
        &self,
        caller: &Caller,
        tool: &CatalogTool,
        arguments: &JsonObject,
        refusal: &Refusal,
    ) {
        let mut details = json!({});
        note_upstream_identity(&mut details, tool);
        let kind = crate::governance::rules::RequestKind::ToolsCall.as_str();
        self.record_refusal_with(caller, kind, &tool.qualified, arguments, refusal, details)
            .await
    }

    async fn record_refusal_with(
        &self,
        caller: &Caller,
        kind: &str,
        tool: &str,
        arguments: &JsonObject,
        refusal: &Refusal,
        mut details: Value,
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
            {
                details["refusal"] = refusal.code().into();
                details["kind"] = kind.into();
                details
            },
        )
        .await
        .ok();
    }
}

/// A renamed tool's row names it as callers do; the upstream's name and the
/// definition's hash keep its identity, as quarantine knows it.
pub(crate) fn note_upstream_identity(details: &mut Value, tool: &CatalogTool) {
    if tool.renamed().is_some() {
        details["upstream_tool"] = tool.upstream_name.as_str().into();
        details["definition_hash"] = tool.hash.as_str().into();
    }
}
