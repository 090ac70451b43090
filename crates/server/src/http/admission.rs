//! Admission control for read-only discovery over HTTP.
//!
//! A restart burst must not turn into hundreds of concurrent listings, each
//! holding a catalog view, policy inputs and a rendered result. At most
//! `max_active` discovery requests run at once and at most `max_queued` wait;
//! beyond that the answer is 503 with `Retry-After` and a JSON-RPC error whose
//! `data.code` is `tool_discovery_busy`. Tool calls are never held here.
//!
//! Waiting is a future on a semaphore: a client that disconnects drops it and
//! leaves the queue; an admitted request that is dropped releases its slot.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::requests::Parsed;
use crate::{Mode, mcp::meta};

/// Limits on concurrent discovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// Discovery requests running at once.
    pub max_active: usize,
    /// Discovery requests waiting for a slot.
    pub max_queued: usize,
    /// What `Retry-After` tells a refused client.
    pub retry_after: Duration,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            max_active: 2,
            max_queued: 32,
            retry_after: Duration::from_secs(1),
        }
    }
}

/// The error code a refused discovery request carries in `error.data.code`.
pub const BUSY_CODE: &str = "tool_discovery_busy";

pub struct Admission {
    config: AdmissionConfig,
    slots: Arc<Semaphore>,
    queued: AtomicUsize,
}

/// Held while an admitted request runs.
pub struct Admitted {
    _permit: OwnedSemaphorePermit,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        metrics::gauge!("manifold_discovery_active").decrement(1.0);
    }
}

/// Counts one waiter for as long as it waits, however the wait ends.
struct Waiting<'a>(&'a Admission);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let depth = self.0.queued.fetch_sub(1, Ordering::SeqCst) - 1;
        metrics::gauge!("manifold_discovery_queue_depth").set(depth as f64);
    }
}

impl Admission {
    pub fn new(config: AdmissionConfig) -> Admission {
        Admission {
            slots: Arc::new(Semaphore::new(config.max_active.max(1))),
            queued: AtomicUsize::new(0),
            config,
        }
    }

    pub fn config(&self) -> AdmissionConfig {
        self.config
    }

    /// Requests waiting now.
    pub fn queue_depth(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// A slot now, a place in the queue, or `None` when both are full.
    pub async fn admit(&self) -> Option<Admitted> {
        let permit = match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                let depth = self.queued.fetch_add(1, Ordering::SeqCst) + 1;
                let waiting = Waiting(self);
                if depth > self.config.max_queued {
                    drop(waiting);
                    metrics::counter!("manifold_discovery_refusals_total").increment(1);
                    return None;
                }
                metrics::gauge!("manifold_discovery_queue_depth").set(depth as f64);
                let permit = Arc::clone(&self.slots)
                    .acquire_owned()
                    .await
                    .expect("the admission semaphore is never closed");
                drop(waiting);
                permit
            }
        };
        metrics::gauge!("manifold_discovery_active").increment(1.0);
        Some(Admitted { _permit: permit })
    }
}

/// The JSON-RPC id of a discovery request, or `None` for anything else.
fn discovery_request(parsed: &Parsed, mode: Mode) -> Option<Value> {
    let discovery = match parsed.method.as_str() {
        "tools/list" | "server/discover" => true,
        "tools/call" if mode != Mode::Direct => {
            parsed.tool.as_deref().is_some_and(meta::is_discovery_tool)
        }
        _ => false,
    };
    discovery.then(|| parsed.id.clone())
}

fn busy(id: Value, retry_after: Duration) -> Response {
    let seconds = retry_after.as_secs().max(1);
    let body = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": -32000,
            "message": "Tool discovery is busy; retry shortly.",
            "data": { "code": BUSY_CODE, "retryAfterSeconds": seconds },
        },
    });
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    response.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from_str(&seconds.to_string()).expect("digits are a valid header"),
    );
    response
}

#[derive(Clone)]
pub(crate) struct AdmissionState {
    pub admission: Arc<Admission>,
    pub mode: Mode,
}

/// Holds a discovery request to the configured concurrency (the slot is
/// held as long as the returned value), or answers 503
/// `tool_discovery_busy`. Anything else passes at once with no slot.
pub(crate) async fn admit_discovery(
    state: &AdmissionState,
    parsed: Option<&Parsed>,
) -> Result<Option<Admitted>, Response> {
    // The request layer (`requests.rs`) read the body once, in front of this.
    let Some(id) = parsed.and_then(|parsed| discovery_request(parsed, state.mode)) else {
        return Ok(None);
    };
    match state.admission.admit().await {
        Some(admitted) => Ok(Some(admitted)),
        None => Err(busy(id, state.admission.config().retry_after)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn admits_queues_then_refuses_and_forgets_leavers() {
        let admission = Arc::new(Admission::new(AdmissionConfig {
            max_active: 1,
            max_queued: 1,
            retry_after: Duration::from_secs(1),
        }));
        let first = admission.admit().await.expect("a free slot");
        let queued = {
            let admission = Arc::clone(&admission);
            tokio::spawn(async move { admission.admit().await.is_some() })
        };
        while admission.queue_depth() == 0 {
            tokio::task::yield_now().await;
        }
        assert!(admission.admit().await.is_none(), "queue full: refused");
        drop(first);
        assert!(queued.await.unwrap(), "the waiter got the slot");
        assert_eq!(admission.queue_depth(), 0);

        // A waiter that goes away leaves the queue.
        let held = admission.admit().await.unwrap();
        let leaver = {
            let admission = Arc::clone(&admission);
            tokio::spawn(async move { admission.admit().await.is_some() })
        };
        while admission.queue_depth() == 0 {
            tokio::task::yield_now().await;
        }
        leaver.abort();
        let _ = leaver.await;
        assert_eq!(admission.queue_depth(), 0);
        drop(held);
    }

    #[test]
    fn recognizes_discovery_requests() {
        let req = |method: &str, id: Value, tool: Option<&str>| Parsed {
            method: method.into(),
            id,
            tool: tool.map(str::to_string),
            request: None,
        };
        let list = req("tools/list", json!(7), None);
        assert_eq!(discovery_request(&list, Mode::Direct), Some(json!(7)));
        let search = req("tools/call", json!("a"), Some("search_tools"));
        assert_eq!(
            discovery_request(&search, Mode::Progressive),
            Some(json!("a"))
        );
        assert_eq!(discovery_request(&search, Mode::Direct), None);
        let call = req("tools/call", json!(1), Some("call_tool"));
        assert_eq!(discovery_request(&call, Mode::Progressive), None);
    }
}
