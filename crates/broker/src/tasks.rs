//! Tasks through the gateway (the `io.modelcontextprotocol/tasks`
//! extension). When an upstream answers a call with a task, the caller gets
//! a random gateway id instead of the upstream's, mapped in the store to the
//! server and the upstream id; `tasks/get`, `tasks/update` and
//! `tasks/cancel` are then decided here, like any request through the door,
//! and forwarded with the upstream id.
//!
//! A task belongs to the caller that started it ([`Caller::task_owner`]):
//! to anybody else its id is unknown, the same answer as for an id that
//! never existed. What a task returns (its inlined result or error, its
//! questions) passes the same guard as a call's answer and writes an
//! activity row (`returned.rs`).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use manifold_catalog::{CatalogTool, CatalogView};
use manifold_store::{CallOutcome, NewTaskRoute, now_ms};
use manifold_upstream::{CallContext, Upstream, UpstreamError};
use rmcp::model::{
    CallToolResponse, CallToolResult, ClientCapabilities, CreateTaskResult, ErrorCode,
    GetTaskResult, InputResponses, JsonObject, TaskPayload, TaskStatus,
};
use serde_json::{Value, json};

use crate::{
    Broker, BrokerError, CallRequest,
    governance::{
        caller::Caller,
        rules::{RequestKind, Subject},
    },
    guardrails::{GuardReport, Guardrails, mask_text},
    returned::{Answered, Returned},
};

/// How often a caller that cannot hold a task handle has its task polled:
/// the upstream's `pollIntervalMs`, within these bounds.
const POLL_AT_LEAST: Duration = Duration::from_millis(250);
const POLL_AT_MOST: Duration = Duration::from_secs(5);

/// Client capabilities that declare the tasks extension and nothing else.
fn tasks_declared() -> ClientCapabilities {
    serde_json::from_value(json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } }))
        .expect("a capabilities literal")
}

/// Whether `answer` is an upstream's `-32021` asking for the tasks
/// extension: the tool runs only as a task, and did not run.
fn requires_task(answer: &Result<CallToolResponse, BrokerError>) -> bool {
    let Err(BrokerError::Upstream(UpstreamError::Rpc { error, .. })) = answer else {
        return false;
    };
    error.code == ErrorCode(-32021)
        && error.data.as_ref().is_some_and(|data| {
            !data["requiredCapabilities"]["extensions"]["io.modelcontextprotocol/tasks"].is_null()
        })
}

/// Where a `tasks/*` request the broker let through goes.
enum Target {
    Upstream(Box<Routed>),
    /// A task the gateway made itself (`gateway_tasks.rs`).
    Gateway(manifold_store::GatewayTask),
}

/// A `tasks/*` request for an upstream's task: the task's upstream and its
/// id there.
struct Routed {
    upstream: std::sync::Arc<Upstream>,
    /// The gateway's id of the task, and the tool whose call made it.
    id: String,
    tool: String,
    upstream_id: String,
    arguments: JsonObject,
    /// The caller's context, with its credential on a per-principal server.
    context: CallContext,
}

pub(crate) fn store_failed(error: manifold_store::StoreError) -> BrokerError {
    BrokerError::Upstream(UpstreamError::Protocol {
        server: String::new(),
        message: format!("the task could not be looked up or kept: {error}"),
    })
}

fn unknown_task(id: &str) -> BrokerError {
    BrokerError::Unknown {
        what: "task",
        name: id.to_string(),
    }
}

impl Broker {
    /// A call for a caller that cannot hold a task handle (a code-mode
    /// script). When the tool runs only as a task (the upstream's `-32021`
    /// for the tasks extension; the tool did not run), the call is made
    /// again declaring the extension, and the task is polled to its end
    /// through the door, like the caller's own `tasks/get`. Dropping the
    /// future (the script's time limit) stops the polling.
    pub async fn call_awaiting_task(
        self: &Arc<Self>,
        view: &CatalogView,
        request: CallRequest<'_>,
    ) -> Result<CallToolResponse, BrokerError> {
        let again = CallRequest {
            arguments: request.arguments.clone(),
            context: CallContext {
                client_capabilities: Some(tasks_declared()),
                ..request.context.clone()
            },
            ..request
        };
        let answer = self
            .call_in_view(
                view,
                CallRequest {
                    arguments: request.arguments,
                    context: request.context,
                    ..again
                },
            )
            .await;
        if !requires_task(&answer) {
            return answer;
        }
        let caller = again.caller;
        let context = again.context.clone();
        let created = match self.call_in_view(view, again).await? {
            CallToolResponse::Task(created) => created,
            answer => return Ok(answer),
        };
        let id = created.task.task_id;
        let every = created
            .task
            .poll_interval_ms
            .map_or(POLL_AT_LEAST, Duration::from_millis)
            .clamp(POLL_AT_LEAST, POLL_AT_MOST);
        loop {
            tokio::time::sleep(every).await;
            let got = self.get_task(caller, &id, &context).await?;
            let server = String::new();
            match got.task.payload {
                TaskPayload::Completed { result } => {
                    let result: CallToolResult = serde_json::from_value(Value::Object(result))
                        .map_err(|error| UpstreamError::Protocol {
                            server,
                            message: format!("a task result that is not a tool result: {error}"),
                        })?;
                    return Ok(CallToolResponse::Complete(result));
                }
                TaskPayload::Failed { error } => {
                    let error = serde_json::from_value(Value::Object(error)).map_err(|e| {
                        UpstreamError::Protocol {
                            server: server.clone(),
                            message: format!("a task error that is not a JSON-RPC error: {e}"),
                        }
                    })?;
                    return Err(UpstreamError::Rpc { server, error }.into());
                }
                TaskPayload::Cancelled => {
                    return Err(UpstreamError::Protocol {
                        server,
                        message: "the task was cancelled".into(),
                    }
                    .into());
                }
                TaskPayload::InputRequired { .. } => {
                    return Err(UpstreamError::Protocol {
                        server,
                        message: "the task asks for input, which this caller cannot give".into(),
                    }
                    .into());
                }
                _ => {}
            }
        }
    }

    /// Makes an upstream's task the caller's: records it, and hands out a
    /// gateway id that `tasks/get` resolves before this returns.
    pub(crate) async fn adopt_task(
        &self,
        caller: &Caller,
        tool: &CatalogTool,
        mut created: CreateTaskResult,
    ) -> Result<CreateTaskResult, BrokerError> {
        let longest =
            i64::try_from(self.governance.config().task_ttl.as_millis()).unwrap_or(i64::MAX);
        let ttl = created
            .task
            .ttl_ms
            .and_then(|ms| i64::try_from(ms).ok())
            .map_or(longest, |ms| ms.min(longest));
        let id = self
            .governance
            .store()
            .create_task_route(
                NewTaskRoute {
                    owner: &caller.task_owner(),
                    principal: &caller.name,
                    token_id: caller.token_id(),
                    server: &tool.server,
                    tool: &tool.qualified,
                    upstream_id: &created.task.task_id,
                    replica: self.replica(),
                },
                now_ms(),
                ttl,
            )
            .await
            .map_err(store_failed)?;
        // The call's row records the answer; this one the task, as a
        // gateway-made task's creation is recorded.
        self.task_row(
            caller,
            &tool.qualified,
            &id,
            "created",
            CallOutcome::Success,
            None,
        )
        .await?;
        created.task.task_id = id;
        created.task.ttl_ms = u64::try_from(ttl).ok();
        Ok(created)
    }

    /// Records the end of a passed-through task once, when a `tasks/get`
    /// first shows it ended (on whichever replica).
    async fn note_task_end(&self, caller: &Caller, route: &Routed, task: &GetTaskResult) {
        let status = task.task.task.status;
        let (name, outcome) = match status {
            TaskStatus::Completed => ("completed", CallOutcome::Success),
            TaskStatus::Failed => ("failed", CallOutcome::Error),
            TaskStatus::Cancelled => ("cancelled", CallOutcome::Error),
            _ => return,
        };
        let store = self.governance.store();
        match store.end_task_route(&route.id, now_ms()).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(error) => {
                tracing::warn!(%error, task = %route.id, "a task's end could not be noted");
                return;
            }
        }
        let message = task.task.task.status_message.clone();
        let _ = self
            .task_row(caller, &route.tool, &route.id, name, outcome, message)
            .await;
    }

    /// Decides a `tasks/*` request: the token must allow calls, the task
    /// must be the caller's, and no rule may refuse its server.
    async fn route_task(
        &self,
        caller: &Caller,
        kind: RequestKind,
        id: &str,
        context: &CallContext,
    ) -> Result<Target, BrokerError> {
        let arguments = match json!({ "taskId": id }) {
            Value::Object(map) => map,
            _ => unreachable!("an object literal"),
        };
        let rules = self.rules_for(caller, kind, id, &arguments).await?;
        let route = self
            .governance
            .store()
            .task_route(&caller.task_owner(), id, now_ms())
            .await
            .map_err(store_failed)?;
        let Some(route) = route else {
            let task = self
                .own_gateway_task(caller, id)
                .await?
                .ok_or_else(|| unknown_task(id))?;
            let subject = Subject::server(&task.server);
            self.decide_request(&rules, caller, kind, &subject, &arguments)
                .await?;
            return Ok(Target::Gateway(task));
        };
        let subject = Subject::server(&route.server);
        self.decide_request(&rules, caller, kind, &subject, &arguments)
            .await?;
        let upstream = self
            .catalog
            .upstream(&route.server)
            .ok_or(UpstreamError::NotConnected {
                server: route.server.clone(),
            })?;
        // A stdio server's task lives in the child process of the replica
        // that made it; this replica's child never heard of it.
        let made_here = match (route.replica.as_deref(), self.replica()) {
            (Some(made), Some(here)) => made == here,
            _ => true,
        };
        if !made_here && upstream.config().transport_kind() == "stdio" {
            return Err(UpstreamError::Protocol {
                server: route.server,
                message: format!(
                    "task {id} runs in this server's child process on the gateway replica \
                     that made it, which this replica cannot reach: send the task's requests \
                     to that replica (route on the Mcp-Name header) or serve it over HTTP"
                ),
            }
            .into());
        }
        let mut context = context.clone();
        crate::call::credential(&upstream, caller, &mut context);
        Ok(Target::Upstream(Box::new(Routed {
            upstream,
            id: route.id,
            tool: route.tool,
            upstream_id: route.upstream_id,
            arguments,
            context,
        })))
    }

    /// `tasks/get` of the caller's task `id`, its answer guarded, under the
    /// gateway id.
    pub async fn get_task(
        &self,
        caller: &Caller,
        id: &str,
        context: &CallContext,
    ) -> Result<GetTaskResult, BrokerError> {
        let started = Instant::now();
        let kind = RequestKind::TasksGet;
        let routed = match self.route_task(caller, kind, id, context).await? {
            Target::Upstream(routed) => routed,
            Target::Gateway(task) => return self.get_gateway_task(caller, task, started).await,
        };
        let result = routed
            .upstream
            .get_task(&routed.upstream_id, &routed.context)
            .await;
        let answered = Answered {
            caller,
            kind,
            named: &Subject::server(routed.upstream.name()).qualified,
            arguments: &routed.arguments,
            started,
        };
        let mut got = self.returned(answered, &routed.upstream, result).await?;
        got.task.task.task_id = id.to_string();
        self.note_task_end(caller, &routed, &got).await;
        Ok(got)
    }

    /// `tasks/update`: the caller's answers to its task's questions.
    pub async fn update_task(
        &self,
        caller: &Caller,
        id: &str,
        responses: InputResponses,
        context: &CallContext,
    ) -> Result<(), BrokerError> {
        let started = Instant::now();
        let kind = RequestKind::TasksUpdate;
        let routed = match self.route_task(caller, kind, id, context).await? {
            Target::Upstream(routed) => routed,
            // A gateway-made task never asks for input: nothing to answer.
            Target::Gateway(_) => return Ok(()),
        };
        let result = routed
            .upstream
            .update_task(&routed.upstream_id, responses, &routed.context)
            .await
            .map(|()| Ack);
        self.task_answered(caller, kind, &routed, started, result)
            .await
    }

    /// `tasks/cancel`: asks the upstream to stop the caller's task.
    pub async fn cancel_task(
        &self,
        caller: &Caller,
        id: &str,
        context: &CallContext,
    ) -> Result<(), BrokerError> {
        let started = Instant::now();
        let kind = RequestKind::TasksCancel;
        let routed = match self.route_task(caller, kind, id, context).await? {
            Target::Upstream(routed) => routed,
            Target::Gateway(task) => return self.cancel_gateway_task(caller, task).await,
        };
        let result = routed
            .upstream
            .cancel_task(&routed.upstream_id, &routed.context)
            .await
            .map(|()| Ack);
        self.task_answered(caller, kind, &routed, started, result)
            .await
    }

    async fn task_answered(
        &self,
        caller: &Caller,
        kind: RequestKind,
        routed: &Routed,
        started: Instant,
        result: Result<Ack, UpstreamError>,
    ) -> Result<(), BrokerError> {
        let answered = Answered {
            caller,
            kind,
            named: &Subject::server(routed.upstream.name()).qualified,
            arguments: &routed.arguments,
            started,
        };
        self.returned(answered, &routed.upstream, result)
            .await
            .map(|Ack| ())
    }
}

/// An upstream's empty acknowledgement of `tasks/update` or `tasks/cancel`.
struct Ack;

impl Returned for Ack {
    fn guard(&mut self, _: &Guardrails, _: usize) -> Result<GuardReport, String> {
        Ok(GuardReport::default())
    }

    fn bytes(&self) -> usize {
        0
    }
}

/// A task's inlined tool result is guarded as a call's result is (masking,
/// `max_result_chars`); its error, questions and status message are masked.
impl Returned for GetTaskResult {
    fn guard(&mut self, guardrails: &Guardrails, max_chars: usize) -> Result<GuardReport, String> {
        let mut report = GuardReport::default();
        if guardrails.mask_secrets
            && let Some(message) = &mut self.task.task.status_message
            && let Some(clean) = mask_text(message, &mut report.masked)
        {
            *message = clean;
        }
        match &mut self.task.payload {
            TaskPayload::Completed { result } => {
                let mut call: CallToolResult = serde_json::from_value(Value::Object(
                    std::mem::take(result),
                ))
                .map_err(|error| format!("a task result that is not a tool result: {error}"))?;
                report.merge(guardrails.apply(&mut call, max_chars));
                *result = match serde_json::to_value(call) {
                    Ok(Value::Object(map)) => map,
                    _ => return Err("a tool result that is not an object".into()),
                };
            }
            TaskPayload::Failed { error } => report.merge(guardrails.guard_returned(error, 0)?),
            TaskPayload::InputRequired { input_requests } => {
                report.merge(guardrails.guard_returned(input_requests, 0)?);
            }
            _ => {}
        }
        Ok(report)
    }

    fn bytes(&self) -> usize {
        manifold_upstream::json_len(self)
    }
}
