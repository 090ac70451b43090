//! Tasks the gateway makes itself: a call of a caller that declared the
//! tasks extension, to an upstream without it, that is still running after
//! `task_after` is answered with a task handle, and goes on in the
//! background. Its guarded result is kept in the store, sealed with the
//! store's secret key, and `tasks/get` returns it to its owner on any
//! replica. `tasks/cancel` marks the row and tells the replica running the
//! call through a store event.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use manifold_store::{
    CallOutcome, Decision, GatewayTask, NewGatewayTask, StoreEvent, TASK_WORKING,
    hash_argument_object, now_ms, oauth::Sealer,
};
use manifold_upstream::UpstreamError;
use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, CreateTaskResult, DetailedTask, ErrorData,
    GetTaskResult, JsonObject, Task, TaskPayload, TaskStatus,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{Broker, BrokerError, audit::AuditUnavailable, governance::caller::Caller};

/// How often a client is told to poll a gateway-made task.
const POLL_INTERVAL_MS: u64 = 1000;

/// What turns long calls into tasks the gateway makes; without it (no
/// sealing key) no call is turned into one.
pub struct GatewayTaskSettings {
    /// How long a call runs before it is answered with a task.
    pub after: Duration,
    /// Working tasks one principal may have at once.
    pub max_per_principal: u64,
    /// The largest result, as JSON, a task keeps.
    pub max_result_bytes: usize,
    /// Seals results at rest.
    pub sealer: Arc<Sealer>,
}

/// The gateway-made tasks this replica runs, by id: their cancellation.
#[derive(Default)]
pub(crate) struct Running(Mutex<HashMap<String, CancellationToken>>);

impl Running {
    fn insert(&self, id: &str, cancel: CancellationToken) {
        self.0
            .lock()
            .expect("not poisoned")
            .insert(id.to_string(), cancel);
    }

    fn remove(&self, id: &str) {
        self.0.lock().expect("not poisoned").remove(id);
    }

    fn cancel(&self, id: &str) {
        if let Some(cancel) = self.0.lock().expect("not poisoned").get(id) {
            cancel.cancel();
        }
    }
}

/// Where the sealed payload of task `id` is bound: a payload moved to
/// another row does not open.
fn sealed_place(id: &str) -> String {
    format!("gateway_task:{id}")
}

/// `ms` since the epoch as RFC 3339 UTC, as the wire's timestamps are.
pub(crate) fn rfc3339(ms: i64) -> String {
    let (secs, millis) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

fn as_object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        other => {
            let mut map = JsonObject::new();
            map.insert("value".into(), other);
            map
        }
    }
}

/// How a finished call ends its task: the status, and the payload kept.
fn task_end(
    result: Result<CallToolResponse, UpstreamError>,
    max_bytes: usize,
) -> (&'static str, Option<String>, Option<Value>) {
    let (status, payload) = match result {
        Ok(CallToolResponse::Complete(result)) => ("completed", json!({ "result": result })),
        Ok(_) => (
            "failed",
            json!({ "error": ErrorData::internal_error(
                "the call asked for input, which a task the gateway made cannot relay", None) }),
        ),
        Err(UpstreamError::Cancelled { .. }) => return ("cancelled", None, None),
        Err(UpstreamError::Rpc { error, .. }) => ("failed", json!({ "error": error })),
        // As a plain call answers it: a tool error the model can read.
        Err(error) => (
            "completed",
            json!({ "result": CallToolResult::error(vec![ContentBlock::text(error.to_string())]) }),
        ),
    };
    let bytes = manifold_upstream::json_len(&payload);
    if bytes > max_bytes {
        let message = format!(
            "the result ({bytes} bytes) is larger than [gateway] max_task_result_bytes ({max_bytes})"
        );
        let error = json!({ "error": ErrorData::internal_error(message.clone(), None) });
        return ("failed", Some(message), Some(error));
    }
    (status, None, Some(payload))
}

impl Broker {
    /// Turns long calls into tasks from now on (see the module doc). Needs
    /// the replica's id (`set_replica`): its rows are failed when it starts
    /// again; without one nothing changes.
    pub fn enable_gateway_tasks(&self, settings: GatewayTaskSettings) {
        if self.replica().is_none() {
            tracing::warn!("gateway-made tasks stay off: this replica has no id");
            return;
        }
        let _ = self.gateway_tasks.set(settings);
    }

    pub(crate) fn gateway_task_settings(&self) -> Option<&GatewayTaskSettings> {
        self.gateway_tasks.get()
    }

    /// Records a task for a call still running, and its creation row.
    /// `None` when the caller has its most tasks working, or the row or
    /// the audit failed: the call then answers as a plain call.
    pub(crate) async fn create_gateway_task(
        &self,
        caller: &Caller,
        server: &str,
        tool: &str,
        cancel: CancellationToken,
    ) -> Option<CreateTaskResult> {
        let settings = self.gateway_tasks.get()?;
        let replica = self.replica()?;
        let ttl = i64::try_from(self.governance.config().task_ttl.as_millis()).unwrap_or(i64::MAX);
        let now = now_ms();
        let new = NewGatewayTask {
            owner: &caller.task_owner(),
            server,
            tool,
            replica,
            now,
            ttl_ms: ttl,
            max_open: settings.max_per_principal,
        };
        let id = match self.governance.store().create_gateway_task(&new).await {
            Ok(Some(id)) => id,
            Ok(None) => {
                tracing::debug!(caller = %caller.name, "at max_tasks_per_principal: not a task");
                return None;
            }
            Err(error) => {
                tracing::warn!(%error, "a gateway task could not be recorded: not a task");
                return None;
            }
        };
        self.running_tasks.insert(&id, cancel);
        let row = self
            .task_row(caller, tool, &id, "created", CallOutcome::Success, None)
            .await;
        if row.is_err() {
            // Not handed out: its end is never written as a task's.
            self.running_tasks.remove(&id);
            let _ = self
                .governance
                .store()
                .finish_gateway_task(&id, "failed", Some("audit unavailable"), None, now_ms())
                .await;
            return None;
        }
        let at = rfc3339(now);
        let task = Task::new(id, TaskStatus::Working, at.clone(), at)
            .with_ttl_ms(u64::try_from(ttl).unwrap_or(u64::MAX))
            .with_poll_interval_ms(POLL_INTERVAL_MS);
        Some(CreateTaskResult::new(task))
    }

    /// Keeps what the call of task `id` returned (already guarded and
    /// audited as a call), sealed, and writes the task's end row.
    pub(crate) async fn end_gateway_task(
        &self,
        caller: &Caller,
        tool: &str,
        id: &str,
        result: Result<CallToolResponse, UpstreamError>,
        recorded: Result<(), AuditUnavailable>,
    ) {
        self.running_tasks.remove(id);
        let Some(settings) = self.gateway_tasks.get() else {
            return;
        };
        let (status, message, payload) = match recorded {
            // A result whose row is not durable is not released.
            Err(error) => ("failed", Some(error.to_string()), None),
            Ok(()) => task_end(result, settings.max_result_bytes),
        };
        let sealed = match payload {
            Some(payload) => {
                match settings
                    .sealer
                    .seal(&sealed_place(id), payload.to_string().as_bytes())
                {
                    Ok(sealed) => Some(sealed),
                    Err(error) => {
                        tracing::warn!(%error, "a task's result could not be sealed");
                        None
                    }
                }
            }
            None => None,
        };
        let store = self.governance.store();
        match store
            .finish_gateway_task(id, status, message.as_deref(), sealed.as_deref(), now_ms())
            .await
        {
            Ok(true) => {}
            Ok(false) => return,
            Err(error) => tracing::warn!(%error, task = id, "a task's end could not be kept"),
        }
        let outcome = if status == "completed" {
            CallOutcome::Success
        } else {
            CallOutcome::Error
        };
        // The call's own row decided its release; this one only reports.
        let _ = self
            .task_row(caller, tool, id, status, outcome, message)
            .await;
    }

    /// The activity row of a task's creation or end.
    pub(crate) async fn task_row(
        &self,
        caller: &Caller,
        tool: &str,
        id: &str,
        status: &str,
        outcome: CallOutcome,
        message: Option<String>,
    ) -> Result<(), AuditUnavailable> {
        let arguments = as_object(json!({ "taskId": id }));
        let mut details = json!({ "kind": "tasks", "task": id, "status": status });
        if let Some(message) = message {
            details["message"] = message.into();
        }
        self.governance
            .record_call(
                caller,
                tool,
                &arguments,
                hash_argument_object(&arguments),
                Decision::Allowed,
                None,
                outcome,
                Duration::ZERO,
                0,
                details,
            )
            .await
    }

    /// The caller's gateway-made task `id`, if it is one.
    pub(crate) async fn own_gateway_task(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<Option<GatewayTask>, BrokerError> {
        if self.gateway_tasks.get().is_none() {
            return Ok(None);
        }
        self.governance
            .store()
            .gateway_task(&caller.task_owner(), id, now_ms())
            .await
            .map_err(crate::tasks::store_failed)
    }

    /// `tasks/get` of a gateway-made task: its status, and when it ended,
    /// its result or error, opened from the store.
    pub(crate) async fn get_gateway_task(
        &self,
        caller: &Caller,
        task: GatewayTask,
        started: Instant,
    ) -> Result<GetTaskResult, BrokerError> {
        let opened = match (&task.payload, self.gateway_tasks.get()) {
            (Some(sealed), Some(settings)) => settings
                .sealer
                .open(&sealed_place(&task.id), sealed)
                .ok()
                .and_then(|plain| serde_json::from_slice::<Value>(&plain).ok()),
            _ => None,
        };
        let failed = |message: &str| TaskPayload::Failed {
            error: as_object(json!(ErrorData::internal_error(message.to_string(), None))),
        };
        let payload = match (task.status.as_str(), opened) {
            (TASK_WORKING, _) => TaskPayload::Working,
            ("cancelled", _) => TaskPayload::Cancelled,
            ("completed", Some(mut kept)) => TaskPayload::Completed {
                result: as_object(kept["result"].take()),
            },
            ("failed", Some(mut kept)) => TaskPayload::Failed {
                error: as_object(kept["error"].take()),
            },
            _ => failed(
                task.message
                    .as_deref()
                    .unwrap_or("the task's result cannot be read"),
            ),
        };
        let mut base = Task::new(
            task.id.clone(),
            TaskStatus::Working,
            rfc3339(task.created_at),
            rfc3339(task.updated_at),
        )
        .with_ttl_ms(u64::try_from(task.expires_at - task.created_at).unwrap_or(0))
        .with_poll_interval_ms(POLL_INTERVAL_MS);
        base.status_message = task.message.clone();
        let got = GetTaskResult::new(DetailedTask::new(base, payload));
        let bytes = manifold_upstream::json_len(&got) as u64;
        self.task_request_row(caller, "tasks/get", &task, started.elapsed(), bytes)
            .await?;
        Ok(got)
    }

    /// `tasks/cancel` of a gateway-made task: marked in the store, and the
    /// replica running it told (itself directly, others by a store event).
    pub(crate) async fn cancel_gateway_task(
        &self,
        caller: &Caller,
        task: GatewayTask,
    ) -> Result<(), BrokerError> {
        let store = self.governance.store();
        let replica = store
            .request_gateway_task_cancel(&caller.task_owner(), &task.id, now_ms())
            .await
            .map_err(crate::tasks::store_failed)?;
        if replica.is_some() {
            self.running_tasks.cancel(&task.id);
            store
                .publish(StoreEvent::GatewayTaskCancelled {
                    id: task.id.clone(),
                })
                .await;
        }
        self.task_request_row(caller, "tasks/cancel", &task, Duration::ZERO, 0)
            .await?;
        Ok(())
    }

    /// The activity row of an answered `tasks/*` request for a gateway-made
    /// task, named as its server's requests are (`server__*`).
    async fn task_request_row(
        &self,
        caller: &Caller,
        kind: &str,
        task: &GatewayTask,
        latency: Duration,
        bytes_out: u64,
    ) -> Result<(), AuditUnavailable> {
        let arguments = as_object(json!({ "taskId": task.id }));
        let details = json!({ "kind": kind, "server": task.server, "task": task.id });
        self.governance
            .record_call(
                caller,
                &crate::governance::rules::Subject::server(&task.server).qualified,
                &arguments,
                hash_argument_object(&arguments),
                Decision::Allowed,
                None,
                CallOutcome::Success,
                latency,
                bytes_out,
                details,
            )
            .await
    }

    /// A store event said task `id` is to stop: if this replica runs it,
    /// its call is cancelled.
    pub fn gateway_task_cancelled(&self, id: &str) {
        self.running_tasks.cancel(id);
    }

    /// After events may have been missed (the store's listener was away):
    /// every task this replica runs whose owner asked it to stop meanwhile
    /// is cancelled, as its event would have done. Returns how many.
    pub async fn recheck_cancelled_gateway_tasks(&self) -> usize {
        let (Some(_), Some(replica)) = (self.gateway_tasks.get(), self.replica()) else {
            return 0;
        };
        let ids = match self
            .governance
            .store()
            .cancel_requested_gateway_tasks(replica)
            .await
        {
            Ok(ids) => ids,
            Err(error) => {
                tracing::warn!(%error, "gateway tasks: cancels not re-read after missed events");
                return 0;
            }
        };
        for id in &ids {
            self.running_tasks.cancel(id);
        }
        ids.len()
    }

    /// At start: the tasks this replica ran before it stopped are failed,
    /// as nothing runs them any more. Returns how many.
    pub async fn fail_orphaned_gateway_tasks(&self) -> u64 {
        let (Some(_), Some(replica)) = (self.gateway_tasks.get(), self.replica()) else {
            return 0;
        };
        self.governance
            .store()
            .fail_gateway_tasks_of(
                replica,
                "the gateway restarted while the call was running",
                now_ms(),
            )
            .await
            .unwrap_or_else(|error| {
                tracing::warn!(%error, "tasks of a previous run could not be marked failed");
                0
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_785_196_800_123), "2026-07-28T00:00:00.123Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn an_oversized_result_fails_its_task_and_says_why() {
        let big = CallToolResult::success(vec![ContentBlock::text("x".repeat(200))]);
        let (status, message, payload) = task_end(Ok(CallToolResponse::Complete(big.clone())), 100);
        assert_eq!(status, "failed");
        assert!(message.unwrap().contains("max_task_result_bytes"));
        assert!(payload.unwrap()["error"]["message"].is_string());
        let (status, _, payload) = task_end(Ok(CallToolResponse::Complete(big)), 1000);
        assert_eq!(status, "completed");
        assert_eq!(
            payload.unwrap()["result"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .len(),
            200
        );
    }
}
