//! Requests to `/mcp`: counted and timed per JSON-RPC method for
//! `/metrics`, and tracked while in flight so a shutdown can drain them.
//!
//! A request counts as in flight until its response body ends, so a call
//! whose answer streams as SSE (progress first) is still drained and timed
//! to its last byte.

use std::{
    sync::{
        Arc,
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
use rmcp::model::{ClientRequest, JsonRpcRequest};
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

fn method_label(method: &str) -> &'static str {
    KNOWN_METHODS
        .iter()
        .find(|known| **known == method)
        .copied()
        .unwrap_or("other")
}

/// JSON-RPC requests (POSTs with a method and an id) being answered now.
#[derive(Default)]
pub struct Requests {
    in_flight: AtomicUsize,
    idle: Notify,
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
    method: &'static str,
    started: Instant,
    status: u16,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::counter!(
            "manifold_requests_total",
            "method" => self.method,
            "status" => status_label(self.status)
        )
        .increment(1);
        metrics::histogram!("manifold_request_duration_seconds", "method" => self.method)
            .record(self.started.elapsed().as_secs_f64());
        metrics::gauge!("manifold_requests_in_flight").decrement(1.0);
        if self.requests.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.requests.idle.notify_waiters();
        }
    }
}

fn status_label(status: u16) -> &'static str {
    match status {
        200..=299 => "2xx",
        401 => "401",
        403 => "403",
        503 => "503",
        400..=499 => "4xx",
        _ => "5xx",
    }
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
        if let Ok(request) = serde_json::from_slice::<JsonRpcRequest<ClientRequest>>(bytes) {
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
    let method = method_label(&parsed.method);
    request.extensions_mut().insert(parsed);
    requests.in_flight.fetch_add(1, Ordering::SeqCst);
    metrics::gauge!("manifold_requests_in_flight").increment(1.0);
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
        assert_eq!(super::method_label("tools/call"), "tools/call");
        assert_eq!(super::method_label("x/secret-123"), "other");
    }
}
