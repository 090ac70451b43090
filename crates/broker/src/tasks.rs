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

use std::time::Instant;

use manifold_store::now_ms;
use manifold_upstream::{CallContext, Upstream, UpstreamError};
use rmcp::model::{
    CallToolResult, CreateTaskResult, GetTaskResult, InputResponses, JsonObject, TaskPayload,
};
use serde_json::{Value, json};

use crate::{
    Broker, BrokerError,
    governance::{
        caller::Caller,
        rules::{RequestKind, Subject},
    },
    guardrails::{GuardReport, Guardrails, mask_text},
    returned::{Answered, Returned},
};

/// A `tasks/*` request the broker let through: the task's upstream and its
/// id there.
struct Routed {
    upstream: std::sync::Arc<Upstream>,
    upstream_id: String,
    arguments: JsonObject,
}

fn store_failed(error: manifold_store::StoreError) -> BrokerError {
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
    /// Makes an upstream's task the caller's: records it, and hands out a
    /// gateway id that `tasks/get` resolves before this returns.
    pub(crate) async fn adopt_task(
        &self,
        caller: &Caller,
        server: &str,
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
                &caller.task_owner(),
                server,
                &created.task.task_id,
                now_ms(),
                ttl,
            )
            .await
            .map_err(store_failed)?;
        created.task.task_id = id;
        created.task.ttl_ms = u64::try_from(ttl).ok();
        Ok(created)
    }

    /// Decides a `tasks/*` request: the token must allow calls, the task
    /// must be the caller's, and no rule may refuse its server.
    async fn route_task(
        &self,
        caller: &Caller,
        kind: RequestKind,
        id: &str,
    ) -> Result<Routed, BrokerError> {
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
            .map_err(store_failed)?
            .ok_or_else(|| unknown_task(id))?;
        let subject = Subject::server(&route.server);
        self.decide_request(&rules, caller, kind, &subject, &arguments)
            .await?;
        let upstream = self
            .catalog
            .upstream(&route.server)
            .ok_or(UpstreamError::NotConnected {
                server: route.server.clone(),
            })?;
        Ok(Routed {
            upstream,
            upstream_id: route.upstream_id,
            arguments,
        })
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
        let routed = self.route_task(caller, kind, id).await?;
        let result = routed.upstream.get_task(&routed.upstream_id, context).await;
        let answered = Answered {
            caller,
            kind,
            named: &Subject::server(routed.upstream.name()).qualified,
            arguments: &routed.arguments,
            started,
        };
        let mut got = self.returned(answered, &routed.upstream, result).await?;
        got.task.task.task_id = id.to_string();
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
        let routed = self.route_task(caller, kind, id).await?;
        let result = routed
            .upstream
            .update_task(&routed.upstream_id, responses, context)
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
        let routed = self.route_task(caller, kind, id).await?;
        let result = routed
            .upstream
            .cancel_task(&routed.upstream_id, context)
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
