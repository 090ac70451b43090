//! Legacy tool calls in flight, so that an explicit `notifications/cancelled`
//! (which rmcp hands the handler after it has already stopped the request)
//! still reaches the broker's upstream call.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use rmcp::model::RequestId;
use tokio_util::sync::CancellationToken;

/// `(caller, request id)` → `(generation, token)`.
type Calls = HashMap<(String, String), (u64, CancellationToken)>;

/// Cancellation tokens of legacy tool calls in flight, keyed by caller and
/// request id. A legacy caller that disconnects does not cancel its call; one
/// that sends `notifications/cancelled` does.
#[derive(Default)]
pub(crate) struct InFlight {
    calls: Arc<Mutex<Calls>>,
    next: std::sync::atomic::AtomicU64,
}

/// How long a call's entry outlives a request that ended by cancellation:
/// rmcp stops the request first and hands the handler the
/// `notifications/cancelled` a moment later.
const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Removes its entry when the request ends; after [`CANCEL_GRACE`] if the
/// request ended by cancellation, so that a late explicit cancel still finds it.
pub(crate) struct InFlightEntry {
    calls: Arc<Mutex<Calls>>,
    key: (String, String),
    generation: u64,
    request: CancellationToken,
}

impl InFlight {
    pub(crate) fn register(
        &self,
        caller: &str,
        request: &RequestId,
        request_ct: &CancellationToken,
    ) -> (CancellationToken, InFlightEntry) {
        let key = (caller.to_string(), request.to_string());
        let token = CancellationToken::new();
        let generation = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), (generation, token.clone()));
        let entry = InFlightEntry {
            calls: Arc::clone(&self.calls),
            key,
            generation,
            request: request_ct.clone(),
        };
        (token, entry)
    }

    pub(crate) fn cancel(&self, caller: &str, request: &RequestId) -> bool {
        let key = (caller.to_string(), request.to_string());
        let entry = self
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        entry.map(|(_, token)| token.cancel()).is_some()
    }
}

impl InFlightEntry {
    fn remove(calls: &Mutex<Calls>, key: &(String, String), generation: u64) {
        let mut calls = calls.lock().unwrap_or_else(|p| p.into_inner());
        // A newer call under the same id keeps its entry.
        if calls.get(key).is_some_and(|(g, _)| *g == generation) {
            calls.remove(key);
        }
    }
}

impl Drop for InFlightEntry {
    fn drop(&mut self) {
        if !self.request.is_cancelled() {
            InFlightEntry::remove(&self.calls, &self.key, self.generation);
            return;
        }
        let (calls, key, generation) = (Arc::clone(&self.calls), self.key.clone(), self.generation);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                tokio::time::sleep(CANCEL_GRACE).await;
                InFlightEntry::remove(&calls, &key, generation);
            });
        }
    }
}
