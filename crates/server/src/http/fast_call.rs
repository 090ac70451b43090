//! Direct-mode `tools/call` without rmcp's per-request machinery.
//!
//! For every stateless POST rmcp's server spawns a service loop, a handler
//! and a waiter, and reads the body again. A plain `tools/call` from a
//! session-free 2025-era client needs none of that: this layer answers it
//! with the same broker call (`mcp::call::direct_call`), rmcp's own message
//! types and the result post-processing rmcp applies to such a peer. Every
//! other request, and any call that is not plain (a session, a 2026-07-28
//! request, a progress token, an MRTR retry, an unusual header), goes on to
//! rmcp unchanged, so the wire stays rmcp's.
//! `crates/manifold/tests/e2e/fast_call.rs`
//! compares both paths byte for byte.

use std::sync::Arc;

use axum::{
    body::{Body, HttpBody},
    extract::Request,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use manifold_broker::Caller;
use manifold_upstream::CallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientRequest, ErrorData, GetMeta,
    JsonRpcRequest, ProtocolVersion, RequestId, ServerJsonRpcMessage, ServerResult,
};
use tokio_util::sync::CancellationToken;

use super::requests::Parsed;
use crate::{
    GatewayState,
    mcp::{call, in_flight::CallOwner, meta},
};

/// The largest body rmcp's Streamable HTTP server reads; a larger one is
/// rmcp's to refuse.
const RMCP_MAX_BODY: usize = 4 * 1024 * 1024;

/// `_meta` keys a plain call may carry: trace context, nothing that asks
/// for progress, logs or a protocol version of its own.
const PLAIN_META_KEYS: &[&str] = &["traceparent", "tracestate"];

/// Answers a plain call; hands anything else back, for rmcp.
pub(crate) async fn answer(
    state: &GatewayState,
    mut request: Request,
) -> Result<Response, Request> {
    if !is_plain(&request) {
        return Err(request);
    }
    let Some(parsed) = request.extensions_mut().remove::<Parsed>() else {
        return Err(request);
    };
    let Some(call) = parsed.request.map(Arc::unwrap_or_clone) else {
        return Err(request);
    };
    let traceparent = call
        .request
        .get_meta()
        .get_traceparent()
        .map(str::to_string)
        .or_else(|| header_str(request.headers(), "traceparent").map(str::to_string));
    let JsonRpcRequest {
        id,
        request: ClientRequest::CallToolRequest(call),
        ..
    } = call
    else {
        unreachable!("is_plain checked the kind");
    };
    // The request ends here: its caller is taken, not cloned.
    let caller = request
        .extensions_mut()
        .remove::<Caller>()
        .unwrap_or_else(Caller::anonymous);
    static FAST_CALLS: std::sync::OnceLock<metrics::Counter> = std::sync::OnceLock::new();
    FAST_CALLS
        .get_or_init(|| metrics::counter!("manifold_fast_calls_total"))
        .increment(1);
    let message = match call_tool(state, &caller, &id, call.params, traceparent).await {
        Ok(result) => ServerJsonRpcMessage::response(result, id),
        Err(error) => ServerJsonRpcMessage::error(error, Some(id)),
    };
    Ok(match serde_json::to_vec(&message) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            Body::from(body),
        )
            .into_response(),
        Err(error) => {
            tracing::error!(%error, "a call result that does not serialise");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    })
}

/// One call, as rmcp's handler path would make it for a session-free
/// legacy peer: the same broker call, context and result shaping.
async fn call_tool(
    state: &GatewayState,
    caller: &Caller,
    id: &RequestId,
    params: CallToolRequestParams,
    traceparent: Option<String>,
) -> Result<ServerResult, ErrorData> {
    tracing::debug!(caller = %caller.name, tool = %params.name, "call");
    // A legacy caller that goes away does not cancel its call; an explicit
    // `notifications/cancelled` does (the in-flight table finds it).
    let request_ct = CancellationToken::new();
    let disconnected = request_ct.clone().drop_guard();
    // No session here: only a caller with an identity can cancel.
    let owner = CallOwner::of(caller, None);
    let (explicit_cancel, _in_flight) = state.in_flight.register(owner, id, &request_ct);
    let context = CallContext {
        client_capabilities: Some(ClientCapabilities::default()),
        cancel: Some(explicit_cancel),
        traceparent,
        ..CallContext::default()
    };
    let response = call::direct_call(state, caller, &params.name, params.arguments, context).await;
    disconnected.disarm();
    match response? {
        // The peer declared no tasks capability (it declared nothing).
        CallToolResponse::Task(_) => Err(ErrorData::missing_required_client_capability(
            ClientCapabilities::builder().enable_tasks().build(),
        )),
        // A session-free legacy peer cannot be asked anything.
        CallToolResponse::InputRequired(_) => Err(ErrorData::invalid_request(
            "InputRequiredResult requires negotiated protocol version 2026-07-28 or newer",
            None,
        )),
        response => {
            let mut result = ServerResult::from(response);
            result.strip_result_type_for_legacy_peer();
            result.strip_non_object_output_for_legacy_peer();
            Ok(result)
        }
    }
}

/// A request this layer may answer: a POST to `/mcp` with no session,
/// the media types rmcp wants, a legacy protocol version (or none), and a
/// `tools/call` of a real tool with nothing in it that needs rmcp.
fn is_plain(request: &Request) -> bool {
    let headers = request.headers();
    let plain_http = request.method() == axum::http::Method::POST
        && request.uri().path() == "/mcp"
        && !headers.contains_key("mcp-session-id")
        && accepts_json_and_sse(headers)
        && header_str(headers, header::CONTENT_TYPE.as_str())
            .and_then(|ct| ct.split(';').next())
            .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
        && legacy_version(headers)
        // The request layer read the body whole; its size is exact.
        && request
            .body()
            .size_hint()
            .exact()
            .is_some_and(|len| len <= RMCP_MAX_BODY as u64);
    if !plain_http {
        return false;
    }
    let Some(parsed) = request
        .extensions()
        .get::<Parsed>()
        .and_then(|parsed| parsed.request.as_deref())
    else {
        return false;
    };
    let ClientRequest::CallToolRequest(call) = &parsed.request else {
        return false;
    };
    call.params.name != meta::CALL_TOOL
        && call.params.input_responses.is_none()
        && call.params.request_state.is_none()
        && call.params.meta.as_ref().is_none_or(|meta| meta.is_empty())
        && parsed
            .request
            .get_meta()
            .keys()
            .all(|key| PLAIN_META_KEYS.contains(&key.as_str()))
}

/// Exactly one value, readable as text.
fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    value.to_str().ok()
}

/// `Accept` names both `application/json` and `text/event-stream`, with no
/// quality weights (weights are rmcp's to read).
fn accepts_json_and_sse(headers: &HeaderMap) -> bool {
    let (mut json, mut sse) = (false, false);
    for value in headers.get_all(header::ACCEPT) {
        let Ok(value) = value.to_str() else {
            return false;
        };
        if value.contains(['q', 'Q', '"']) && value.contains('=') {
            return false;
        }
        for range in value.split(',') {
            let essence = range.split(';').next().unwrap_or_default().trim();
            json |= essence.eq_ignore_ascii_case("application/json");
            sse |= essence.eq_ignore_ascii_case("text/event-stream");
        }
    }
    json && sse
}

/// No `MCP-Protocol-Version`, or one known version before 2026-07-28.
fn legacy_version(headers: &HeaderMap) -> bool {
    if !headers.contains_key("mcp-protocol-version") {
        return true;
    }
    header_str(headers, "mcp-protocol-version").is_some_and(|version| {
        version < ProtocolVersion::V_2026_07_28.as_str()
            && ProtocolVersion::KNOWN_VERSIONS
                .iter()
                .any(|known| known.as_str() == version)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn accept_needs_both_types_and_leaves_weights_to_rmcp() {
        assert!(accepts_json_and_sse(&headers(&[(
            "accept",
            "application/json, text/event-stream"
        )])));
        assert!(accepts_json_and_sse(&headers(&[
            ("accept", "application/json"),
            ("accept", "text/event-stream")
        ])));
        assert!(!accepts_json_and_sse(&headers(&[(
            "accept",
            "application/json"
        )])));
        assert!(!accepts_json_and_sse(&headers(&[(
            "accept",
            "application/json;q=0, text/event-stream"
        )])));
    }

    #[test]
    fn only_known_legacy_versions_are_plain() {
        assert!(legacy_version(&headers(&[])));
        assert!(legacy_version(&headers(&[(
            "mcp-protocol-version",
            "2025-11-25"
        )])));
        assert!(!legacy_version(&headers(&[(
            "mcp-protocol-version",
            "2026-07-28"
        )])));
        assert!(!legacy_version(&headers(&[(
            "mcp-protocol-version",
            "2099-01-01"
        )])));
        assert!(!legacy_version(&headers(&[
            ("mcp-protocol-version", "2025-11-25"),
            ("mcp-protocol-version", "2025-06-18")
        ])));
    }
}
