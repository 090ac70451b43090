//! The broker: the one path from any surface to an upstream.
//!
//! Every tool call (the `call_tool` meta-tool, direct-mode calls, code mode,
//! `POST /call`) goes through [`Broker::call`]; every other request that
//! reaches an upstream for a caller (prompts, resources, completions,
//! subscriptions, a caller's own server switches) is decided by the broker
//! too and sent with the [`Allowed`] it returned (see `door.rs`).
//!
//! `call` resolves the tool in the caller's view, validates the arguments
//! against the tool's `inputSchema`, asks [`Governance`] whether the call may
//! go ahead (token, quarantine, policy, rate limits, approval), forwards it
//! under the server's timeout and concurrency cap, and records one activity
//! row whatever happened.

mod audit;
mod detach;
mod door;
pub mod governance;
pub mod guardrails;
pub mod policy;
mod snapshot;
mod validate;

use std::{sync::Arc, time::Instant};

use manifold_catalog::{CallEnd, CatalogView, PrimitiveCatalog, ToolCatalog};
use manifold_store::{CallOutcome, hash_argument_object};
use manifold_upstream::{CallContext, UpstreamError};
use rmcp::model::{CallToolResponse, JsonObject};
use serde_json::{Value, json};

pub use door::{Allowed, RequestKind, Rules, Subject};

use crate::guardrails::GuardReport;
pub use governance::{
    Authorized, Caller, DEFAULT_AUDIT_RETENTION_DAYS, Governance, GovernanceConfig, Provenance,
    Refusal, SweepReport, UserGrant, Visible,
};
pub use policy::QuarantineRules;
pub use snapshot::{POSTGRES_WATCH, SQLITE_WATCH};
pub use validate::ArgumentValidator;

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("unknown tool '{name}'")]
    UnknownTool { name: String },
    /// A prompt, resource or server no upstream has.
    #[error("unknown {what} '{name}'")]
    Unknown { what: &'static str, name: String },
    #[error("invalid arguments for '{tool}': {}", violations.join("; "))]
    InvalidArguments {
        tool: String,
        violations: Vec<String>,
    },
    #[error("{0}")]
    Refused(#[from] Refusal),
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
}

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

/// What came back from a forwarded call, for its audit row.
struct Forwarded<'a> {
    result: &'a Result<CallToolResponse, UpstreamError>,
    guarded: &'a GuardReport,
    /// Whose OAuth token the call carried (`shared`, or the principal).
    credential: Option<&'a str>,
}

pub struct Broker {
    catalog: Arc<ToolCatalog>,
    /// Prompts and resources of the same upstreams; private, so that only
    /// the broker finds the upstream a request goes to.
    primitives: PrimitiveCatalog,
    governance: Arc<Governance>,
    validator: ArgumentValidator,
}

impl Broker {
    pub fn new(catalog: Arc<ToolCatalog>, governance: Arc<Governance>) -> Arc<Self> {
        Arc::new(Self {
            primitives: PrimitiveCatalog::new(Arc::clone(&catalog)),
            catalog,
            governance,
            validator: ArgumentValidator::default(),
        })
    }

    pub fn catalog(&self) -> &Arc<ToolCatalog> {
        &self.catalog
    }

    pub fn governance(&self) -> &Arc<Governance> {
        &self.governance
    }

    /// Resolve, authorize, validate and forward one call.
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
    ///
    /// Once authorized, the upstream call and its audit row run in a task of
    /// their own: a caller that goes away does not cancel them (the upstream
    /// may already be acting), while an explicit MCP cancellation does.
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
            mut context,
        } = request;
        let mut arguments = arguments.unwrap_or_default();
        let Some(tool) = view.tool(name) else {
            // Boxed: rare, and kilobytes in every call's future otherwise.
            if let Some(answer) = Box::pin(self.sign_in_first(view, caller, name)).await {
                return Err(answer);
            }
            let refusal = BrokerError::UnknownTool {
                name: name.to_string(),
            };
            self.governance
                .record_call(
                    caller,
                    name,
                    &arguments,
                    hash_argument_object(&arguments),
                    manifold_store::Decision::Denied,
                    None,
                    CallOutcome::NotForwarded,
                    started.elapsed(),
                    0,
                    json!({ "refusal": "unknown_tool", "kind": RequestKind::ToolsCall.as_str() }),
                )
                .await;
            record_call_metric("", "", "unknown_tool");
            return Err(refusal);
        };
        let span = tracing::info_span!("broker.call", server = %tool.server, tool = %tool.upstream_name, caller = %caller.name);
        if let Some(traceparent) = context.traceparent.as_deref() {
            manifold_upstream::join_caller_trace(&span, traceparent);
        }
        let authorize = self.governance.authorize_with(
            caller,
            tool,
            &arguments,
            approval_id,
            provenance,
            &context,
        );
        // An approval wait shows in the trace as part of the call.
        let authorized = match tracing::Instrument::instrument(authorize, span.clone()).await {
            Ok(authorized) => authorized,
            Err(refusal) => {
                span.in_scope(|| tracing::debug!(outcome = refusal.code(), "call refused"));
                record_call_metric(&tool.server, &tool.upstream_name, refusal.code());
                self.governance
                    .record_refusal(
                        caller,
                        RequestKind::ToolsCall.as_str(),
                        &tool.qualified,
                        &arguments,
                        &refusal,
                    )
                    .await;
                return Err(refusal.into());
            }
        };
        let violations = self.validator.check(tool, &mut arguments);
        if !violations.is_empty() {
            span.in_scope(|| tracing::debug!(outcome = "invalid_arguments", "call refused"));
            record_call_metric(&tool.server, &tool.upstream_name, "invalid_arguments");
            self.record(caller, tool, &arguments, &authorized, &started, None)
                .await;
            return Err(BrokerError::InvalidArguments {
                tool: tool.qualified.clone(),
                violations,
            });
        }
        let upstream =
            self.catalog
                .upstream(&tool.server)
                .ok_or_else(|| UpstreamError::NotConnected {
                    server: tool.server.clone(),
                })?;
        // Whose token the upstream sees, for the audit: an OAuth server's
        // shared sign-in, or on a per-principal server the caller's own.
        let credential = (upstream.config().auth == Some(manifold_upstream::UpstreamAuth::Oauth))
            .then(|| {
                if upstream.per_principal() {
                    context.principal = Some(caller.principal.0.clone());
                    caller.principal.0.clone()
                } else {
                    "shared".to_string()
                }
            });
        let forwarded = Instant::now();
        let cancel = context.cancel.clone();
        // Other calls' rows may wait for this one to join their commit.
        let coming = self.governance.audit.row_coming();
        let work = {
            let broker = Arc::clone(self);
            let (caller, tool, authorized) = (caller.clone(), Arc::clone(tool), authorized.clone());
            let max_chars = upstream.config().max_result_chars;
            let work = async move {
                let _coming = coming;
                // Pinned where it is made and scoped to its block: one copy
                // of it in this future, not one per binding and one more in
                // `select!`, and its space is reused by the record below.
                let mut result = {
                    let upstream_call = std::pin::pin!(upstream.call_tool_with(
                        &tool.upstream_name,
                        Some(arguments.clone()),
                        &context
                    ));
                    let mut call = broker
                        .governance
                        .audit
                        .commit_lingering_during(upstream_call);
                    match cancel {
                        Some(cancel) => tokio::select! {
                            result = &mut call => result,
                            () = cancel.cancelled() => Err(UpstreamError::Cancelled { server: tool.server.clone() }),
                        },
                        None => call.await,
                    }
                };
                let guarded = match &mut result {
                    Ok(CallToolResponse::Complete(r)) => broker.guard(r, max_chars),
                    _ => Default::default(),
                };
                let forwarded = Forwarded {
                    result: &result,
                    guarded: &guarded,
                    credential: credential.as_deref(),
                };
                broker
                    .record(
                        &caller,
                        &tool,
                        &arguments,
                        &authorized,
                        &started,
                        Some(forwarded),
                    )
                    .await;
                result
            };
            // Boxed before it is instrumented: `instrument` moves its future
            // by value, and this one is kilobytes. The upstream request's
            // span is a child of this call's span.
            let work: detach::Work<_> = Box::pin(work);
            Box::pin(tracing::Instrument::instrument(work, span.clone()))
        };
        // A caller that goes away does not cancel the call (`detach.rs`).
        let result = match detach::Detached::new(work).await {
            Ok(result) => result,
            Err(panic) => Err(UpstreamError::Protocol {
                server: tool.server.clone(),
                message: format!("the call task failed: {}", detach::panic_message(&*panic)),
            }),
        };
        if let (Some(provenance), Ok(_)) = (provenance, &result)
            && self.governance.is_untrusted(&tool.server)
        {
            provenance.record_read(&tool.server);
        }
        let outcome = match &result {
            Ok(CallToolResponse::Complete(r)) if r.is_error == Some(true) => CallEnd::ToolError,
            Ok(_) => CallEnd::Ok,
            Err(UpstreamError::Cancelled { .. }) => CallEnd::Cancelled,
            Err(_) => CallEnd::UpstreamError,
        };
        tool.record_call(outcome, forwarded.elapsed());
        span.in_scope(|| {
            tracing::debug!(
                outcome = outcome.label(),
                elapsed_us = started.elapsed().as_micros() as u64,
                "call finished"
            )
        });
        Ok(result?)
    }

    async fn record(
        &self,
        caller: &Caller,
        tool: &manifold_catalog::CatalogTool,
        arguments: &JsonObject,
        authorized: &Authorized,
        started: &Instant,
        forwarded: Option<Forwarded<'_>>,
    ) {
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
            Some((Err(error), _)) => (
                CallOutcome::Error,
                0,
                json!({ "upstream_error": error.to_string() }),
            ),
        };
        if let (Some(credential), Value::Object(details)) = (credential, &mut details) {
            details.insert("credential".into(), credential.into());
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
            .await;
    }
}

impl Broker {
    /// Masks and cuts a result by the guardrails: this server's
    /// `max_result_chars`, else the global one.
    fn guard(
        &self,
        result: &mut rmcp::model::CallToolResult,
        server_max: Option<usize>,
    ) -> GuardReport {
        let guardrails = self.governance.config().guardrails;
        guardrails.apply(result, server_max.unwrap_or(guardrails.max_result_chars))
    }
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
