//! Requests to `/mcp`: counted and timed per JSON-RPC method for
//! `/metrics`, and tracked while in flight so a shutdown can drain them.
//!
//! A request counts as in flight until its response body ends, so a call
//! whose answer streams as SSE (progress first) is still drained and timed
//! to its last byte.

use std::{
    sync::{
        Arc, OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{
    body::Body,
    extract::Request,
    http::{Method, StatusCode},
    response::{IntoResponse, Response},
};
use futures::StreamExt;
use rmcp::model::{CallToolRequest, ClientRequest, JsonRpcRequest, JsonRpcVersion2_0, RequestId};
use serde::Deserialize;
use tokio::sync::Notify;

/// Methods a client may send; anything else is counted as `other`, so a
/// client cannot grow the label set.
const KNOWN_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "server/discover",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "completion/complete",
    "logging/setLevel",
    "subscriptions/listen",
];

/// The largest body read to find the method; the MCP layer refuses larger.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// A method's place in [`KNOWN_METHODS`]; one past its end is `other`.
fn method_index(method: &str) -> usize {
    KNOWN_METHODS
        .iter()
        .position(|known| *known == method)
        .unwrap_or(KNOWN_METHODS.len())
}

fn method_label(index: usize) -> &'static str {
    KNOWN_METHODS.get(index).copied().unwrap_or("other")
}

/// JSON-RPC requests (POSTs with a method and an id) being answered now.
#[derive(Default)]
pub struct Requests {
    in_flight: AtomicUsize,
    idle: Notify,
    metrics: RequestMetrics,
}

/// Metric handles, each registered when first used: looked up by name and
/// labels on every request, they were a registry lookup and a few
/// allocations each.
#[derive(Default)]
struct RequestMetrics {
    in_flight: OnceLock<metrics::Gauge>,
    /// By [`method_index`].
    methods: [OnceLock<MethodMetrics>; KNOWN_METHODS.len() + 1],
}

struct MethodMetrics {
    duration: metrics::Histogram,
    /// By [`STATUS_LABELS`].
    by_status: [OnceLock<metrics::Counter>; STATUS_LABELS.len()],
}

impl RequestMetrics {
    fn in_flight(&self) -> &metrics::Gauge {
        self.in_flight
            .get_or_init(|| metrics::gauge!("manifold_requests_in_flight"))
    }

    fn finished(&self, method: usize, status: u16, took: Duration) {
        let label = method_label(method);
        let metrics = self.methods[method].get_or_init(|| MethodMetrics {
            duration: metrics::histogram!("manifold_request_duration_seconds", "method" => label),
            by_status: Default::default(),
        });
        let status = status_index(status);
        metrics.by_status[status]
            .get_or_init(|| {
                metrics::counter!(
                    "manifold_requests_total",
                    "method" => label,
                    "status" => STATUS_LABELS[status]
                )
            })
            .increment(1);
        metrics.duration.record(took.as_secs_f64());
    }
}

impl Requests {
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Waits until no request is in flight, or `timeout` passes. True when
    /// the gateway went idle.
    pub async fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let idle = self.idle.notified();
            if self.in_flight() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return self.in_flight() == 0;
            }
        }
    }
}

/// Held from the request's arrival to the end of its response body.
pub(crate) struct InFlight {
    requests: Arc<Requests>,
    /// By [`method_index`].
    method: usize,
    started: Instant,
    status: u16,
}

impl InFlight {
    /// The status the request is counted under, for a reply that goes out
    /// other than as this request's response (a legacy SSE stream).
    pub(crate) fn set_status(&mut self, status: u16) {
        self.status = status;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let metrics = &self.requests.metrics;
        metrics.finished(self.method, self.status, self.started.elapsed());
        metrics.in_flight().decrement(1.0);
        if self.requests.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.requests.idle.notify_waiters();
        }
    }
}

const STATUS_LABELS: [&str; 6] = ["2xx", "401", "403", "503", "4xx", "5xx"];

fn status_index(status: u16) -> usize {
    match status {
        200..=299 => 0,
        401 => 1,
        403 => 2,
        503 => 3,
        400..=499 => 4,
        _ => 5,
    }
}

/// A `tools/call` read as one, not through rmcp's `ClientRequest`: that
/// enum is untagged, so serde buffers the message and tries the kinds before
/// it one by one (about forty allocations a call). What this reads is what
/// that would read; anything it cannot read goes the general way.
fn read_call(bytes: &[u8]) -> Option<JsonRpcRequest<ClientRequest>> {
    let envelope = serde_json::from_slice::<Envelope>(bytes).ok()?;
    if envelope.method != "tools/call" {
        return None;
    }
    // `method` and `params`; `jsonrpc` and `id` are left to `envelope`.
    let call = serde_json::from_slice::<CallToolRequest>(bytes).ok()?;
    Some(JsonRpcRequest {
        jsonrpc: envelope.jsonrpc,
        id: envelope.id,
        request: ClientRequest::CallToolRequest(call),
    })
}

/// A request's fields besides its `params`, which are skipped unread.
#[derive(Deserialize)]
struct Envelope<'a> {
    jsonrpc: JsonRpcVersion2_0,
    id: RequestId,
    #[serde(borrow)]
    method: std::borrow::Cow<'a, str>,
}

#[derive(Deserialize)]
struct Head {
    method: Option<String>,
    id: Option<serde_json::Value>,
    params: Option<HeadParams>,
}

#[derive(Deserialize)]
struct HeadParams {
    name: Option<serde_json::Value>,
}

/// What the layers behind this one need of a JSON-RPC request: read once
/// here and carried in the request's extensions.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    pub method: String,
    pub id: serde_json::Value,
    /// `params.name` of a `tools/call`.
    pub tool: Option<String>,
    /// The whole request as rmcp's types read it, when they do.
    pub request: Option<Arc<JsonRpcRequest<ClientRequest>>>,
}

impl Parsed {
    /// Reads a request body: as rmcp's request type if it is one (the form
    /// the fast call path answers from), else just its method, id and name
    /// for the metrics and admission.
    fn read(bytes: &[u8]) -> Option<Parsed> {
        let request = read_call(bytes)
            .or_else(|| serde_json::from_slice::<JsonRpcRequest<ClientRequest>>(bytes).ok());
        if let Some(request) = request {
            let tool = match &request.request {
                ClientRequest::CallToolRequest(call) => Some(call.params.name.to_string()),
                _ => None,
            };
            return Some(Parsed {
                method: request.request.method().to_string(),
                id: serde_json::to_value(&request.id).unwrap_or_default(),
                tool,
                request: Some(Arc::new(request)),
            });
        }
        match serde_json::from_slice::<Head>(bytes) {
            Ok(Head {
                method: Some(method),
                id: Some(id),
                params,
            }) => Some(Parsed {
                tool: params
                    .and_then(|p| p.name)
                    .and_then(|n| n.as_str().map(str::to_string)),
                method,
                id,
                request: None,
            }),
            _ => None,
        }
    }
}

/// Reads a POST's body once and, for a JSON-RPC request, puts its
/// [`Parsed`] form in the request's extensions and starts tracking it:
/// in flight until [`finish`]'s response body ends. Notifications, responses
/// and other methods pass untracked.
pub(crate) async fn read(
    requests: &Arc<Requests>,
    request: Request,
) -> Result<(Request, Option<InFlight>), Response> {
    if request.method() != Method::POST {
        return Ok((request, None));
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY).await else {
        return Err(StatusCode::PAYLOAD_TOO_LARGE.into_response());
    };
    let parsed = Parsed::read(&bytes);
    let mut request = Request::from_parts(parts, Body::from(bytes));
    let Some(parsed) = parsed else {
        return Ok((request, None));
    };
    let method = method_index(&parsed.method);
    request.extensions_mut().insert(parsed);
    requests.in_flight.fetch_add(1, Ordering::SeqCst);
    requests.metrics.in_flight().increment(1.0);
    let in_flight = InFlight {
        requests: Arc::clone(requests),
        method,
        started: Instant::now(),
        status: 500,
    };
    Ok((request, Some(in_flight)))
}

/// Ends the tracking [`read`] started once `response`'s body has ended.
pub(crate) fn finish(in_flight: Option<InFlight>, response: Response) -> Response {
    let Some(mut in_flight) = in_flight else {
        return response;
    };
    in_flight.status = response.status().as_u16();
    let (parts, body) = response.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _held = &in_flight;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(body))
}

#[cfg(test)]
mod tests {
    #[test]
    fn unknown_methods_share_one_label() {
        let label = |method| super::method_label(super::method_index(method));
        assert_eq!(label("tools/call"), "tools/call");
        assert_eq!(label("x/secret-123"), "other");
    }

    /// The direct read of a call gives what rmcp's untagged `ClientRequest`
    /// gives, and leaves everything else to it.
    #[test]
    fn a_call_read_directly_is_what_rmcp_reads() {
        use rmcp::model::{ClientRequest, JsonRpcRequest};
        let calls = [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"time__now"}}"#,
            r#"{"jsonrpc":"2.0","id":"a-7","method":"tools/call","params":{"name":"alpha__echo","arguments":{"text":"hi","n":12345678901234567890,"x":1.5,"nested":{"l":[1,null,true]}}}}"#,
            r#"{"params":{"_meta":{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","progressToken":3},"name":"a__b","arguments":{}},"method":"tools/call","id":9,"jsonrpc":"2.0"}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"a__b","task":{"ttl":1000},"extra":"kept?"}}"#,
        ];
        for body in calls {
            let direct = super::read_call(body.as_bytes()).expect("read directly");
            let general: JsonRpcRequest<ClientRequest> = serde_json::from_str(body).unwrap();
            assert_eq!(
                serde_json::to_value(&direct).unwrap(),
                serde_json::to_value(&general).unwrap(),
                "{body}"
            );
            assert!(matches!(direct.request, ClientRequest::CallToolRequest(_)));
        }
        let others = [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{}}}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"a"}}"#,
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"a"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"},"method":"x"}"#,
            "not json",
        ];
        for body in others {
            assert!(super::read_call(body.as_bytes()).is_none(), "{body}");
        }
    }
}
