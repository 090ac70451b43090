//! Forwarding one downstream request to an upstream on the caller's behalf.
//!
//! While the upstream works, what it sends for the caller (progress, log
//! messages, server-to-client requests of legacy upstreams) arrives as
//! [`Relay`] messages and is passed on from inside the downstream request's
//! own task, so it rides the same response stream. Cancelling the downstream
//! request drops the upstream future, which cancels the upstream request.
//!
//! Input the upstream needs comes back in one of two shapes. A 2026-07-28
//! client gets an `InputRequiredResult` untouched and retries with
//! `inputResponses`/`requestState`, which pass through. A legacy client cannot
//! read that result, so the gateway asks it the questions itself, as
//! `sampling/createMessage`, `elicitation/create` or `roots/list` requests on
//! its session, and retries upstream with the answers.
//!
//! What is relayed passes the result guardrails first ([`Guardrails`]):
//! progress and log messages, and the sampling and elicitation requests,
//! are masked like results; one that cannot be guarded is not passed on.
#![allow(deprecated)] // Logging, sampling and roots (SEP-2577) are still relayed.

use std::future::Future;

use manifold_broker::guardrails::Guardrails;
use manifold_upstream::{CallContext, Relay, UpstreamError};
use rmcp::{
    ErrorData as McpError, RoleServer, ServiceError,
    model::{
        CallToolResponse, ClientResult, GetPromptResponse, InputRequest, InputRequiredResult,
        InputResponses, LoggingLevel, ProgressToken, ProtocolVersion, ReadResourceResponse,
        ServerRequest,
    },
    service::RequestContext,
};
use tokio::sync::mpsc;

/// Question rounds a legacy caller's request may take before we give up.
const MAX_ROUNDS: usize = 10;

/// Whether the request speaks 2026-07-28 or later (MRTR, no server-to-client
/// requests, per-request log level).
pub(crate) fn is_modern(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
}

/// A JSON-RPC error from the upstream passes through unchanged; anything else
/// the gateway could not do is an internal error with the reason.
pub(crate) fn upstream_error(error: UpstreamError) -> McpError {
    match error {
        UpstreamError::Rpc { error, .. } => error,
        other => McpError::internal_error(other.to_string(), None),
    }
}

/// Responses that may ask for input instead of completing.
pub(crate) trait MaybeInputRequired: Sized {
    fn into_input_required(self) -> Result<InputRequiredResult, Self>;
}

impl MaybeInputRequired for CallToolResponse {
    fn into_input_required(self) -> Result<InputRequiredResult, Self> {
        match self {
            CallToolResponse::InputRequired(r) => Ok(r),
            other => Err(other),
        }
    }
}

impl MaybeInputRequired for GetPromptResponse {
    fn into_input_required(self) -> Result<InputRequiredResult, Self> {
        match self {
            GetPromptResponse::InputRequired(r) => Ok(r),
            other => Err(other),
        }
    }
}

impl MaybeInputRequired for ReadResourceResponse {
    fn into_input_required(self) -> Result<InputRequiredResult, Self> {
        match self {
            ReadResourceResponse::InputRequired(r) => Ok(r),
            other => Err(other),
        }
    }
}

/// The W3C trace context the caller sent: in the request's `_meta`
/// (SEP-414), else as an HTTP header.
fn caller_traceparent(context: &RequestContext<RoleServer>) -> Option<String> {
    if let Some(traceparent) = context.meta.get_traceparent() {
        return Some(traceparent.to_string());
    }
    let parts = context.extensions.get::<http::request::Parts>()?;
    let header = parts.headers.get("traceparent")?.to_str().ok()?;
    Some(header.to_string())
}

/// Run `attempt` (one upstream request, given its [`CallContext`]) for the
/// downstream request in `context`, relaying as described above, until it
/// completes. `log_level` is the level a legacy session set; a 2026-07-28
/// request carries its own. `first` is the caller's own MRTR retry state.
/// `guardrails` guard what is relayed.
pub(crate) async fn forward_with_rounds<T, F, Fut>(
    context: &RequestContext<RoleServer>,
    guardrails: Guardrails,
    log_level: Option<LoggingLevel>,
    first: (Option<InputResponses>, Option<String>),
    mut attempt: F,
) -> Result<T, McpError>
where
    T: MaybeInputRequired,
    F: FnMut(CallContext) -> Fut,
    Fut: Future<Output = Result<T, McpError>>,
{
    let modern = is_modern(context);
    let (mut responses, mut state) = first;
    for _ in 0..MAX_ROUNDS {
        let (relay, relayed) = mpsc::unbounded_channel();
        let call = CallContext {
            client_capabilities: Some(context.client_capabilities().unwrap_or_default()),
            log_level: if modern {
                context.meta.log_level()
            } else {
                log_level
            },
            relay: Some(relay),
            cancel: None,
            input_responses: responses.take(),
            request_state: state.take(),
            traceparent: caller_traceparent(context),
            principal: None,
        };
        let response = run_relayed(context, guardrails, relayed, attempt(call)).await??;
        if modern {
            return Ok(response);
        }
        match response.into_input_required() {
            Err(done) => return Ok(done),
            Ok(input_required) => {
                (responses, state) = ask_downstream(context, input_required).await?;
            }
        }
    }
    Err(McpError::internal_error(
        format!("the upstream still wanted input after {MAX_ROUNDS} rounds"),
        None,
    ))
}

/// Drive `work` while passing its relays on to the downstream peer, until it
/// finishes or the downstream request is cancelled (which drops `work`).
async fn run_relayed<T>(
    context: &RequestContext<RoleServer>,
    guardrails: Guardrails,
    mut relayed: mpsc::UnboundedReceiver<Relay>,
    work: impl Future<Output = T>,
) -> Result<T, McpError> {
    let progress_token = context.meta.get_progress_token();
    let mut work = std::pin::pin!(work);
    loop {
        // Relays first: what the upstream sent before its response reaches the
        // caller before the response does.
        tokio::select! {
            biased;
            Some(relay) = relayed.recv() => pass_on(context, &guardrails, progress_token.as_ref(), relay).await,
            out = &mut work => {
                // A request left over has nobody waiting for its answer.
                while let Ok(relay) = relayed.try_recv() {
                    if !matches!(relay, Relay::Request { .. }) {
                        pass_on(context, &guardrails, progress_token.as_ref(), relay).await;
                    }
                }
                return Ok(out);
            }
            () = context.ct.cancelled() => {
                return Err(McpError::internal_error("cancelled by the client", None));
            }
        }
    }
}

async fn pass_on(
    context: &RequestContext<RoleServer>,
    guardrails: &Guardrails,
    progress_token: Option<&ProgressToken>,
    relay: Relay,
) {
    let peer = &context.peer;
    match relay {
        Relay::Progress(mut progress) => {
            // Only a caller that asked for progress hears of it, under its token.
            let Some(token) = progress_token else { return };
            if guardrails.guard_returned(&mut progress, 0).is_err() {
                return;
            }
            progress.progress_token = token.clone();
            if let Err(error) = peer.notify_progress(progress).await {
                tracing::debug!(%error, "progress not delivered");
            }
        }
        Relay::Log(mut message) => {
            if guardrails.guard_returned(&mut message, 0).is_err() {
                return;
            }
            if let Err(error) = peer.notify_logging_message(message).await {
                tracing::debug!(%error, "log message not delivered");
            }
        }
        Relay::Request { mut request, reply } => {
            let answer = if let Err(why) = guardrails.guard_returned(&mut request, 0) {
                Err(McpError::internal_error(
                    format!(
                        "the gateway could not guard this request, so it was not passed on: {why}"
                    ),
                    None,
                ))
            } else if is_modern(context) {
                Err(McpError::invalid_request(
                    "the downstream client speaks 2026-07-28 and takes no server-to-client \
                     requests; the upstream must return InputRequiredResult",
                    None,
                ))
            } else {
                tokio::select! {
                    answer = peer.send_request(request) => answer.map_err(downstream_error),
                    () = context.ct.cancelled() => Err(McpError::internal_error("cancelled by the client", None)),
                }
            };
            let _ = reply.send(answer);
        }
    }
}

fn downstream_error(error: ServiceError) -> McpError {
    match error {
        ServiceError::McpError(error) => error,
        other => McpError::internal_error(format!("asking the client failed: {other}"), None),
    }
}

/// Ask a legacy client what an `InputRequiredResult` wants to know, as
/// server-to-client requests on its session; returns the retry's
/// `inputResponses` and `requestState`.
async fn ask_downstream(
    context: &RequestContext<RoleServer>,
    input_required: InputRequiredResult,
) -> Result<(Option<InputResponses>, Option<String>), McpError> {
    let mut responses = InputResponses::new();
    for (key, question) in input_required.input_requests.unwrap_or_default() {
        let request = match question {
            InputRequest::CreateMessage(r) => ServerRequest::CreateMessageRequest(r),
            InputRequest::Elicitation(r) => ServerRequest::ElicitRequest(r),
            InputRequest::ListRoots(r) => ServerRequest::ListRootsRequest(r),
            other => {
                return Err(McpError::internal_error(
                    format!("cannot ask a legacy client {other:?}"),
                    None,
                ));
            }
        };
        let answer: ClientResult = tokio::select! {
            answer = context.peer.send_request(request) => answer.map_err(downstream_error)?,
            () = context.ct.cancelled() => {
                return Err(McpError::internal_error("cancelled by the client", None));
            }
        };
        let value = serde_json::to_value(answer)
            .map_err(|e| McpError::internal_error(format!("client answer: {e}"), None))?;
        responses.insert(key, value);
    }
    Ok((
        (!responses.is_empty()).then_some(responses),
        input_required.request_state,
    ))
}
