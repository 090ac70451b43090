//! W3C trace context on upstream requests.
//!
//! Each forwarded request runs in an `upstream.request` span. When an
//! OpenTelemetry layer is installed (the binary's `[telemetry]`), that span's
//! context goes upstream as `traceparent`: in the request's `_meta` (the MCP
//! convention, which stdio servers can read) and, for HTTP upstreams, as an
//! HTTP header (which proxies and HTTP middleware read). Without a layer the
//! span has no trace id and nothing is sent.

use std::{collections::HashMap, sync::Arc};

use http::{HeaderName, HeaderValue};
use opentelemetry::{
    Context,
    trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState},
};
use rmcp::{
    model::ClientJsonRpcMessage,
    transport::{
        common::client_side_sse::BoxedSseResponse,
        streamable_http_client::{
            StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
            StreamableHttpResponseLimits,
        },
    },
};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// `00-<trace id>-<span id>-<flags>` for `span`, if it belongs to a trace.
pub(crate) fn traceparent(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    let span = context.span();
    let span = span.span_context();
    span.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            span.trace_id(),
            span.span_id(),
            span.trace_flags().to_u8()
        )
    })
}

/// Makes `span` a child of the caller's span that `traceparent` names, when
/// it is well formed (version 00 layout; unknown later versions are read the
/// same way, as the W3C spec asks). Call it before `span` is entered.
pub fn join_caller_trace(span: &tracing::Span, traceparent: &str) {
    let parts: Vec<&str> = traceparent.trim().split('-').collect();
    let [version, trace, parent, flags, ..] = parts[..] else {
        return;
    };
    if version.len() != 2 || version == "ff" || trace.len() != 32 || parent.len() != 16 {
        return;
    }
    let (Ok(trace), Ok(parent), Ok(flags)) = (
        TraceId::from_hex(trace),
        SpanId::from_hex(parent),
        u8::from_str_radix(flags, 16),
    ) else {
        return;
    };
    if trace == TraceId::INVALID || parent == SpanId::INVALID {
        return;
    }
    let remote = SpanContext::new(
        trace,
        parent,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    );
    let _ = span.set_parent(Context::new().with_remote_span_context(remote));
}

/// The HTTP client of HTTP upstreams: rmcp's reqwest client, plus the
/// `traceparent` header copied from the `_meta` of each request it posts.
/// (rmcp sends messages from its own task, so the header cannot come from
/// the current span there; the message carries it instead.)
#[derive(Clone, Default)]
pub(crate) struct TracingHttpClient(pub reqwest::Client);

/// What rmcp's own client follows: up to 10 same-origin 307 or 308
/// redirects (they keep the method and body; anything else would lose the
/// message or send headers to another host).
pub(crate) fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        let keeps_body = matches!(attempt.status().as_u16(), 307 | 308);
        if same_origin && keeps_body && attempt.previous().len() <= 10 {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

pub(crate) fn with_traceparent(
    message: &ClientJsonRpcMessage,
    mut headers: HashMap<HeaderName, HeaderValue>,
) -> HashMap<HeaderName, HeaderValue> {
    let ClientJsonRpcMessage::Request(request) = message else {
        return headers;
    };
    let Ok(value) = serde_json::to_value(&request.request) else {
        return headers;
    };
    if let Some(value) = value["params"]["_meta"]["traceparent"]
        .as_str()
        .and_then(|t| HeaderValue::from_str(t).ok())
    {
        headers.insert(TRACEPARENT, value);
    }
    headers
}

impl StreamableHttpClient for TracingHttpClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let headers = with_traceparent(&message, custom_headers);
        self.0
            .post_message(uri, message, session_id, auth_header, headers)
            .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let headers = with_traceparent(&message, custom_headers);
        self.0
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                headers,
                max_sse_event_size,
            )
            .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let headers = with_traceparent(&message, custom_headers);
        self.0
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                headers,
                limits,
            )
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.0
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxedSseResponse, StreamableHttpError<Self::Error>> {
        self.0
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxedSseResponse, StreamableHttpError<Self::Error>> {
        self.0
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}
