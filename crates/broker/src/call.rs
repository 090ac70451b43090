//! One tool call: admit → resolve → decide → validate → forward → guard → record.
//!
//! - admit: before the name is looked up, the token's `call` action and
//!   the principal-wide rate limits.
//! - resolve: the name in the caller's view. An unknown name is refused and
//!   recorded (cut, under the ceiling on failure rows), unless it belongs to a per-principal server the caller has
//!   not signed in to: the answer is then that server's sign-in.
//! - decide: governance ([`Governance::authorize_with`]): the token,
//!   quarantine, policy, rate limits, the taint rule and approval. A
//!   refusal is recorded.
//! - validate: the arguments against the tool's `inputSchema`. Invalid
//!   arguments are recorded and not forwarded.
//! - forward: the request to the upstream, as work of its own: a caller
//!   that goes away does not cancel it (the upstream may already be
//!   acting), while an explicit MCP cancellation does. The work guards and
//!   records what comes back too, so a call whose caller has gone is still
//!   masked and audited.
//!   A caller that declared the tasks extension, calling an upstream
//!   without it, gets a task handle once the call has run `task_after`;
//!   the work then ends the task (`gateway_tasks.rs`).
//! - guard: the result masked and cut by the guardrails.
//! - record: one activity row, whatever happened.
//!
//! Only `forward` deals in future sizes: a call's future is kilobytes, so it
//! is pinned and boxed where it is built and not moved again.
//!
//! [`Governance::authorize_with`]: crate::Governance::authorize_with

use std::{sync::Arc, time::Instant};

use manifold_catalog::{CallEnd, CatalogTool, CatalogView};
use manifold_store::CallOutcome;
use manifold_upstream::{CallContext, Upstream, UpstreamAuth, UpstreamError};
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, CreateTaskResult, JsonObject};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    Broker, BrokerError,
    audit::AuditUnavailable,
    detach,
    governance::{
        authorize::Authorized,
        caller::{Caller, Provenance},
        refusal::Refusal,
        rules::RequestKind,
    },
    guardrails::GuardReport,
};

/// One call as a surface hands it to the broker.
pub struct CallRequest<'a> {
    pub caller: &'a Caller,
    /// The qualified name the caller used.
    pub tool: &'a str,
    pub arguments: Option<JsonObject>,
    /// An approval the caller presents for this exact call.
    pub approval_id: Option<&'a str>,
    /// Set for calls from a code-mode run: what the run has read so far.
    pub provenance: Option<&'a Provenance>,
    /// Where the upstream's progress, logs and questions for this caller go,
    /// the caller's cancellation and trace context. Default: nowhere.
    pub context: CallContext,
}

/// What the steps of one resolved call share.
struct Call<'a> {
    caller: &'a Caller,
    tool: &'a Arc<CatalogTool>,
    approval_id: Option<&'a str>,
    provenance: Option<&'a Provenance>,
    started: Instant,
    span: tracing::Span,
    /// The call already runs as a task the gateway made: it is not made
    /// one again.
    in_task: bool,
}

/// What came back from a forwarded call, for its audit row.
struct Forwarded<'a> {
    result: &'a Result<CallToolResponse, UpstreamError>,
    guarded: &'a GuardReport,
    /// Whose OAuth token the call carried (`shared`, or the principal).
    credential: Option<&'a str>,
}

impl Broker {
    /// Resolve, decide, validate and forward one call.
    pub async fn call(
        self: &Arc<Self>,
        request: CallRequest<'_>,
    ) -> Result<CallToolResponse, BrokerError> {
        let view = self
            .catalog
            .view_for_call(&request.caller.principal, request.tool)
            .await;
        self.call_in_view(&view, request).await
    }

    /// Like [`Broker::call`], reusing a view the surface already holds. The
    /// view is the unfiltered catalog: governance decides here, afresh.
    pub async fn call_in_view(
        self: &Arc<Self>,
        view: &CatalogView,
        request: CallRequest<'_>,
    ) -> Result<CallToolResponse, BrokerError> {
        let started = Instant::now();
        let CallRequest {
            caller,
            tool: name,
            arguments,
            approval_id,
            provenance,
            context,
        } = request;
        let mut arguments = arguments.unwrap_or_default();
        self.admit(caller, name, &arguments).await?;
        let tool = self
            .resolve(view, caller, name, &arguments, &started)
            .await?;
        let call = Call {
            caller,
            tool,
            approval_id,
            provenance,
            started,
            span: call_span(caller, tool, &context),
            in_task: false,
        };
        if self.may_become_task(&call, &context) {
            self.within_task_limit(&call, &arguments).await?;
            if let Some((created, owner)) = self.task_while_approved(&call).await {
                let id = created.task.task_id.clone();
                self.run_approved_as_task(&call, arguments, context, id, owner);
                return Ok(CallToolResponse::Task(created));
            }
        }
        let authorized = self.decide(&call, &arguments, &context).await?;
        self.validate(&call, &mut arguments, &authorized).await?;
        self.forward(&call, arguments, authorized, context).await
    }

    /// The tool `name` names in `view`; see the module doc.
    async fn resolve<'v>(
        &self,
        view: &'v CatalogView,
        caller: &Caller,
        name: &str,
        arguments: &JsonObject,
        started: &Instant,
    ) -> Result<&'v Arc<CatalogTool>, BrokerError> {
        if let Some(tool) = view.tool(name) {
            return Ok(tool);
        }
        // Boxed: rare, and kilobytes in every call's future otherwise.
        if let Some(answer) = Box::pin(self.sign_in_first(view, caller, name)).await {
            return Err(answer);
        }
        self.governance
            .record_unknown_tool(caller, name, arguments, started.elapsed())
            .await;
        record_call_metric("", "", "unknown_tool");
        Err(BrokerError::UnknownTool {
            name: name.to_string(),
        })
    }

    /// What a call must pass before its name is looked up: an audit that
    /// can record it, the token's `call` action and the principal-wide rate
    /// limits. A refusal is recorded, with the name cut.
    async fn admit(
        &self,
        caller: &Caller,
        name: &str,
        arguments: &JsonObject,
    ) -> Result<(), BrokerError> {
        self.governance.audit_ready(caller).await?;
        let Err(refusal) = self.governance.admit_call(caller).await else {
            return Ok(());
        };
        record_call_metric("", "", refusal.code());
        self.governance
            .record_refusal(
                caller,
                RequestKind::ToolsCall.as_str(),
                name,
                arguments,
                &refusal,
            )
            .await;
        Err(refusal.into())
    }

    /// Whether the call may go ahead; a refusal is recorded.
    async fn decide(
        &self,
        call: &Call<'_>,
        arguments: &JsonObject,
        context: &CallContext,
    ) -> Result<Authorized, BrokerError> {
        let authorize = self.governance.authorize_with(
            call.caller,
            call.tool,
            arguments,
            call.approval_id,
            call.provenance,
            context,
        );
        // An approval wait shows in the trace as part of the call.
        let refusal = match tracing::Instrument::instrument(authorize, call.span.clone()).await {
            Ok(authorized) => return Ok(authorized),
            Err(refusal) => refusal,
        };
        let tool = call.tool;
        call.span
            .in_scope(|| tracing::debug!(outcome = refusal.code(), "call refused"));
        record_call_metric(&tool.server, &tool.upstream_name, refusal.code());
        self.governance
            .record_tool_refusal(call.caller, tool, arguments, &refusal)
            .await;
        Err(refusal.into())
    }

    /// Whether the call may become a task the gateway makes: its caller
    /// declared the tasks extension, its upstream has none, and the gateway
    /// makes tasks. Cheap: a plain call stops at the declaration.
    fn may_become_task(&self, call: &Call<'_>, context: &CallContext) -> bool {
        let declared = context
            .client_capabilities
            .as_ref()
            .is_some_and(|capabilities| capabilities.supports_tasks());
        declared
            && call.provenance.is_none()
            && self.gateway_task_settings().is_some()
            && self
                .catalog
                .upstream(&call.tool.server)
                .is_some_and(|upstream| !upstream.supports_tasks())
    }

    /// Refuses, before anything runs, a call that may become a task of a
    /// caller with `max_tasks_per_principal` tasks working.
    async fn within_task_limit(
        &self,
        call: &Call<'_>,
        arguments: &JsonObject,
    ) -> Result<(), BrokerError> {
        let Some(settings) = self.gateway_task_settings() else {
            return Ok(());
        };
        let owner = call.caller.task_owner();
        let open = self
            .governance
            .store()
            .open_gateway_tasks(&owner, manifold_store::now_ms())
            .await
            .map_err(Refusal::from)?;
        if open < settings.max_per_principal {
            return Ok(());
        }
        let refusal = Refusal::TooManyTasks {
            max: settings.max_per_principal,
        };
        record_call_metric(&call.tool.server, &call.tool.upstream_name, refusal.code());
        self.governance
            .record_tool_refusal(call.caller, call.tool, arguments, &refusal)
            .await;
        Err(refusal.into())
    }

    /// A call (one that may become a task) that must wait for an operator's
    /// approval becomes a task at once, recorded before the handle is
    /// returned: the handle and the task's own cancel.
    async fn task_while_approved(
        &self,
        call: &Call<'_>,
    ) -> Option<(CreateTaskResult, CancellationToken)> {
        if call.approval_id.is_some()
            || !self.governance.needs_approval(call.caller, call.tool).await
        {
            return None;
        }
        let owner = CancellationToken::new();
        let created = self
            .create_gateway_task(
                call.caller,
                &call.tool.server,
                &call.tool.qualified,
                owner.clone(),
            )
            .await?;
        Some((created, owner))
    }

    /// Waits for the approval, then validates and forwards the call, as the
    /// work of task `id`; the task ends with what came back, or with the
    /// refusal as a tool error (as a plain call answers it).
    fn run_approved_as_task(
        self: &Arc<Self>,
        call: &Call<'_>,
        mut arguments: JsonObject,
        mut context: CallContext,
        id: String,
        owner: CancellationToken,
    ) {
        let broker = Arc::clone(self);
        let (caller, tool) = (call.caller.clone(), Arc::clone(call.tool));
        let (started, span) = (call.started, call.span.clone());
        // The request is answered now, and rmcp cancels its token then: the
        // call listens to the task's own cancel instead.
        context.cancel = Some(owner.clone());
        tokio::spawn(async move {
            let call = Call {
                caller: &caller,
                tool: &tool,
                approval_id: None,
                provenance: None,
                started,
                span,
                in_task: true,
            };
            let ran = async {
                let authorized = tokio::select! {
                    decided = broker.decide(&call, &arguments, &context) => decided?,
                    () = owner.cancelled() => {
                        return Err(BrokerError::Upstream(UpstreamError::Cancelled {
                            server: tool.server.clone(),
                        }));
                    }
                };
                broker.validate(&call, &mut arguments, &authorized).await?;
                broker.forward(&call, arguments, authorized, context).await
            };
            let (result, recorded) = match ran.await {
                Ok(response) => (Ok(response), Ok(())),
                Err(BrokerError::Upstream(error)) => (Err(error), Ok(())),
                Err(BrokerError::AuditUnavailable(error)) => (
                    Err(UpstreamError::Protocol {
                        server: tool.server.clone(),
                        message: error.to_string(),
                    }),
                    Err(error),
                ),
                Err(refused) => {
                    let answer =
                        CallToolResult::error(vec![ContentBlock::text(refused.to_string())]);
                    (Ok(CallToolResponse::Complete(answer)), Ok(()))
                }
            };
            broker
                .end_gateway_task(&caller, &tool.qualified, &id, result, recorded)
                .await;
        });
    }

    /// The arguments against the tool's `inputSchema`, which may fill in
    /// defaults; invalid ones are recorded.
    async fn validate(
        &self,
        call: &Call<'_>,
        arguments: &mut JsonObject,
        authorized: &Authorized,
    ) -> Result<(), BrokerError> {
        let tool = call.tool;
        let violations = self.validator.check(tool, arguments);
        if violations.is_empty() {
            return Ok(());
        }
        call.span
            .in_scope(|| tracing::debug!(outcome = "invalid_arguments", "call refused"));
        record_call_metric(&tool.server, &tool.upstream_name, "invalid_arguments");
        self.record(
            call.caller,
            tool,
            arguments,
            authorized,
            &call.started,
            None,
        )
        .await?;
        Err(BrokerError::InvalidArguments {
            tool: tool.qualified.clone(),
            violations,
        })
    }

    /// Sends the call to its upstream, then guards and records what came
    /// back, as work that outlives a caller who goes away (`detach.rs`).
    async fn forward(
        self: &Arc<Self>,
        call: &Call<'_>,
        arguments: JsonObject,
        authorized: Authorized,
        mut context: CallContext,
    ) -> Result<CallToolResponse, BrokerError> {
        let upstream = self.catalog.upstream(&call.tool.server).ok_or_else(|| {
            UpstreamError::NotConnected {
                server: call.tool.server.clone(),
            }
        })?;
        let credential = credential(&upstream, call.caller, &mut context);
        // A call that may become a task the gateway makes can be cancelled
        // by the task's owner too, after its request has been answered.
        let settings = self.gateway_task_settings().filter(|_| !call.in_task);
        let as_task = settings.and_then(|settings| {
            let declared = context
                .client_capabilities
                .as_ref()
                .is_some_and(|capabilities| capabilities.supports_tasks());
            (declared && !upstream.supports_tasks()).then(|| {
                (
                    settings.after,
                    TaskStop {
                        owner: CancellationToken::new(),
                        handed: CancellationToken::new(),
                    },
                )
            })
        });
        let forwarded = Instant::now();
        let cancel = context.cancel.clone();
        let stop = as_task.as_ref().map(|(_, stop)| stop.clone());
        // Other calls' rows may wait for this one to join their commit.
        let coming = self.governance.begin_call();
        let work = {
            let broker = Arc::clone(self);
            let (caller, tool) = (call.caller.clone(), Arc::clone(call.tool));
            let (started, max_chars) = (call.started, upstream.config().max_result_chars);
            let work = async move {
                let _coming = coming;
                // Pinned where it is made and scoped to its block: one copy
                // of it in this future, not one per binding and one more in
                // `select!`, and its space is reused by the record below.
                let mut result = {
                    let mut sent = std::pin::pin!(upstream.call_tool_with(
                        &tool.upstream_name,
                        Some(arguments.clone()),
                        &context
                    ));
                    match (cancel, stop) {
                        (None, None) => sent.await,
                        (cancel, stop) => tokio::select! {
                            result = &mut sent => result,
                            () = stopped(cancel, stop) => Err(UpstreamError::Cancelled { server: tool.server.clone() }),
                        },
                    }
                };
                let guarded = broker.guard(&mut result, max_chars);
                let forwarded = Forwarded {
                    result: &result,
                    guarded: &guarded,
                    credential: credential.as_deref(),
                };
                let recorded = broker
                    .record(
                        &caller,
                        &tool,
                        &arguments,
                        &authorized,
                        &started,
                        Some(forwarded),
                    )
                    .await;
                (result, recorded)
            };
            // Boxed before it is instrumented: `instrument` moves its future
            // by value, and this one is kilobytes. The upstream request's
            // span is a child of this call's span.
            let work: detach::Work<_> = Box::pin(work);
            Box::pin(tracing::Instrument::instrument(work, call.span.clone()))
        };
        let mut detached = detach::Detached::new(work);
        let done = match as_task {
            Some((after, stop)) => match tokio::time::timeout(after, &mut detached).await {
                Ok(done) => done,
                Err(_) => match self
                    .create_gateway_task(
                        call.caller,
                        &call.tool.server,
                        &call.tool.qualified,
                        stop.owner,
                    )
                    .await
                {
                    Some(created) => {
                        // From now on the request's end is not the call's.
                        stop.handed.cancel();
                        self.run_as_task(call, &created.task.task_id, forwarded, detached);
                        return Ok(CallToolResponse::Task(created));
                    }
                    None => detached.await,
                },
            },
            None => detached.await,
        };
        let (result, recorded) = match done {
            Ok(done) => done,
            Err(panic) => (
                Err(UpstreamError::Protocol {
                    server: call.tool.server.clone(),
                    message: format!("the call task failed: {}", detach::panic_message(&*panic)),
                }),
                Ok(()),
            ),
        };
        self.tally(call, &result, forwarded);
        // No answer of a call whose row is not durable goes out as success.
        recorded?;
        match result? {
            CallToolResponse::Task(created) => {
                let created = self.adopt_task(call.caller, call.tool, created).await?;
                Ok(CallToolResponse::Task(created))
            }
            answer => Ok(answer),
        }
    }

    /// The rest of a call answered with a task handle runs on its own and
    /// ends the task (`gateway_tasks.rs`).
    fn run_as_task(
        self: &Arc<Self>,
        call: &Call<'_>,
        id: &str,
        forwarded: Instant,
        detached: detach::Detached<Done>,
    ) {
        let broker = Arc::clone(self);
        let (caller, tool, id) = (call.caller.clone(), Arc::clone(call.tool), id.to_string());
        tokio::spawn(async move {
            let (result, recorded) = match detached.await {
                Ok(done) => done,
                Err(panic) => (
                    Err(UpstreamError::Protocol {
                        server: tool.server.clone(),
                        message: format!(
                            "the call task failed: {}",
                            detach::panic_message(&*panic)
                        ),
                    }),
                    Ok(()),
                ),
            };
            tool.record_call(call_end(&result), forwarded.elapsed());
            broker
                .end_gateway_task(&caller, &tool.qualified, &id, result, recorded)
                .await;
        });
    }

    /// Masks and cuts a complete result by the guardrails: this server's
    /// `max_result_chars`, else the global one.
    fn guard(
        &self,
        result: &mut Result<CallToolResponse, UpstreamError>,
        server_max: Option<usize>,
    ) -> GuardReport {
        let guardrails = self.governance.config().guardrails;
        let Ok(CallToolResponse::Complete(result)) = result else {
            return crate::returned::guard_call_response(&guardrails, result);
        };
        guardrails.apply(result, server_max.unwrap_or(guardrails.max_result_chars))
    }

    /// The call's activity row: forwarded, or (none) refused for its
    /// arguments.
    async fn record(
        &self,
        caller: &Caller,
        tool: &CatalogTool,
        arguments: &JsonObject,
        authorized: &Authorized,
        started: &Instant,
        forwarded: Option<Forwarded<'_>>,
    ) -> Result<(), AuditUnavailable> {
        let credential = forwarded.as_ref().and_then(|f| f.credential);
        let result = forwarded.map(|f| (f.result, f.guarded));
        let (outcome, bytes_out, mut details) = match result {
            None => (
                CallOutcome::NotForwarded,
                0,
                json!({ "refusal": "invalid_arguments", "kind": RequestKind::ToolsCall.as_str() }),
            ),
            Some((Ok(response), guarded)) => {
                let bytes = match response {
                    CallToolResponse::Complete(r) => manifold_upstream::json_len(r),
                    CallToolResponse::InputRequired(r) => manifold_upstream::json_len(r),
                    CallToolResponse::Task(r) => manifold_upstream::json_len(r),
                    _ => 0,
                } as u64;
                let is_error =
                    matches!(response, CallToolResponse::Complete(r) if r.is_error == Some(true));
                let outcome = if is_error {
                    CallOutcome::Error
                } else {
                    CallOutcome::Success
                };
                (outcome, bytes, guarded.to_json())
            }
            Some((Err(error), guarded)) => {
                // Masked by the guard already, like a result.
                let mut details = guarded.to_json();
                details["upstream_error"] = error.to_string().into();
                (CallOutcome::Error, 0, details)
            }
        };
        crate::audit::note_upstream_identity(&mut details, tool);
        if let Value::Object(details) = &mut details {
            // Every row says its kind, a forwarded call's as a refusal's.
            details
                .entry("kind")
                .or_insert(RequestKind::ToolsCall.as_str().into());
            if let Some(credential) = credential {
                details.insert("credential".into(), credential.into());
            }
        }
        self.governance
            .record_call(
                caller,
                &tool.qualified,
                arguments,
                authorized.args_hash.clone(),
                authorized.decision,
                authorized.approval_id.clone(),
                outcome,
                started.elapsed(),
                bytes_out,
                details,
            )
            .await
    }

    /// What the caller's side notes once the call came back: what a
    /// code-mode run has now read, the tool's call statistics, the trace.
    fn tally(
        &self,
        call: &Call<'_>,
        result: &Result<CallToolResponse, UpstreamError>,
        forwarded: Instant,
    ) {
        let tool = call.tool;
        if let (Some(provenance), Ok(_)) = (call.provenance, result)
            && self.governance.is_untrusted(&tool.server)
        {
            provenance.record_read(&tool.server);
        }
        let outcome = call_end(result);
        tool.record_call(outcome, forwarded.elapsed());
        call.span.in_scope(|| {
            tracing::debug!(
                outcome = outcome.label(),
                elapsed_us = call.started.elapsed().as_micros() as u64,
                "call finished"
            )
        });
    }
}

/// How a call that may become a task the gateway makes is stopped.
#[derive(Clone)]
struct TaskStop {
    /// Cancelled by the task's owner (`tasks/cancel`).
    owner: CancellationToken,
    /// Cancelled once the caller holds a task handle: the request is
    /// answered then, and its cancellation no longer stops the call.
    handed: CancellationToken,
}

/// Returns when the call is to stop: its caller cancelled the request
/// (before it became a task), or the task's owner cancelled the task.
async fn stopped(caller: Option<CancellationToken>, task: Option<TaskStop>) {
    let by_caller = async {
        match &caller {
            Some(caller) => caller.cancelled().await,
            None => std::future::pending().await,
        }
        if task.as_ref().is_some_and(|task| task.handed.is_cancelled()) {
            std::future::pending::<()>().await;
        }
    };
    match &task {
        Some(task) => tokio::select! {
            () = by_caller => {}
            () = task.owner.cancelled() => {}
        },
        None => by_caller.await,
    }
}

/// What a forwarded call came back with, for its tool's statistics.
fn call_end(result: &Result<CallToolResponse, UpstreamError>) -> CallEnd {
    match result {
        Ok(CallToolResponse::Complete(r)) if r.is_error == Some(true) => CallEnd::ToolError,
        Ok(_) => CallEnd::Ok,
        Err(UpstreamError::Cancelled { .. }) => CallEnd::Cancelled,
        Err(_) => CallEnd::UpstreamError,
    }
}

/// What the work of a forwarded call ends with: its result, and whether
/// its row is durable.
type Done = (
    Result<CallToolResponse, UpstreamError>,
    Result<(), AuditUnavailable>,
);

/// The call's span, in the caller's trace if it sent one.
fn call_span(caller: &Caller, tool: &CatalogTool, context: &CallContext) -> tracing::Span {
    let span = tracing::info_span!("broker.call", server = %tool.server, tool = %tool.upstream_name, caller = %caller.name);
    if let Some(traceparent) = context.traceparent.as_deref() {
        manifold_upstream::join_caller_trace(&span, traceparent);
    }
    span
}

/// Whose token the upstream sees, for the audit: an OAuth server's shared
/// sign-in, or on a per-principal server the caller's own, which the
/// request then names.
pub(crate) fn credential(
    upstream: &Upstream,
    caller: &Caller,
    context: &mut CallContext,
) -> Option<String> {
    (upstream.config().auth == Some(UpstreamAuth::Oauth)).then(|| {
        if upstream.per_principal() {
            context.principal = Some(caller.principal.0.clone());
            caller.principal.0.clone()
        } else {
            "shared".to_string()
        }
    })
}

/// For refusals, which have no handles of their own (the tool may be
/// unknown). Server and tool names come from the catalog, never from the
/// request, so the label set stays as small as the configured catalog.
fn record_call_metric(server: &str, tool: &str, outcome: &'static str) {
    metrics::counter!(
        "manifold_tool_calls_total",
        "server" => server.to_string(),
        "tool" => tool.to_string(),
        "outcome" => outcome
    )
    .increment(1);
}
