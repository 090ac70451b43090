//! Legacy tool calls in flight, so that an explicit `notifications/cancelled`
//! (which rmcp hands the handler after it has already stopped the request)
//! still reaches the broker's upstream call.
//!
//! A call is found by who made it: the caller's identity (gateway token id
//! or identity-provider subject), its MCP session, and the request id. A
//! display name is not enough: with auth off every caller is `anonymous`,
//! and request ids are small numbers anybody can guess. A caller with
//! neither an identity nor a session cannot be told apart from another, so
//! its calls are not registered and its explicit cancels are ignored.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use manifold_broker::Caller;
use rmcp::model::RequestId;
use tokio_util::sync::CancellationToken;

/// `(owner, request id)` → `(generation, token)`.
type Calls = HashMap<(CallOwner, String), (u64, CancellationToken)>;

/// Who may cancel a call: the same identity in the same session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct CallOwner {
    identity: Option<String>,
    session: Option<String>,
}

impl CallOwner {
    /// The owner of `caller`'s calls in `session`, or `None` when there is
    /// nothing to tell this caller apart from another (auth off, no
    /// session).
    pub(crate) fn of(caller: &Caller, session: Option<&str>) -> Option<CallOwner> {
        let identity = caller.identity_key();
        let session = session.map(str::to_string);
        (identity.is_some() || session.is_some()).then_some(CallOwner { identity, session })
    }
}

/// Cancellation tokens of legacy tool calls in flight, keyed by owner and
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
    key: (CallOwner, String),
    generation: u64,
    request: CancellationToken,
}

impl InFlight {
    /// Registers a call; the token it returns is cancelled by an explicit
    /// cancel from the same owner. A call without an owner gets a token that
    /// nothing cancels.
    pub(crate) fn register(
        &self,
        owner: Option<CallOwner>,
        request: &RequestId,
        request_ct: &CancellationToken,
    ) -> (CancellationToken, Option<InFlightEntry>) {
        let token = CancellationToken::new();
        let Some(owner) = owner else {
            return (token, None);
        };
        let key = (owner, request.to_string());
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
        (token, Some(entry))
    }

    /// Cancels `owner`'s call `request`, if it is in flight.
    pub(crate) fn cancel(&self, owner: Option<CallOwner>, request: &RequestId) -> bool {
        let Some(owner) = owner else {
            return false;
        };
        let key = (owner, request.to_string());
        let entry = self
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        entry.map(|(_, token)| token.cancel()).is_some()
    }
}

impl InFlightEntry {
    fn remove(calls: &Mutex<Calls>, key: &(CallOwner, String), generation: u64) {
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

#[cfg(test)]
mod tests {
    use manifold_catalog::Principal;

    use super::*;

    fn token_caller(id: &str) -> Caller {
        Caller::with_token(manifold_store::TokenRecord {
            id: id.into(),
            name: id.into(),
            created_at: 0,
            expires_at: None,
            revoked_at: None,
            actions: Default::default(),
            scopes: Vec::new(),
        })
    }

    #[test]
    fn a_call_is_cancelled_only_by_its_own_identity_and_session() {
        let in_flight = InFlight::default();
        let request_ct = CancellationToken::new();
        let id = RequestId::Number(1);
        let alice = token_caller("alice");
        let (token, _entry) =
            in_flight.register(CallOwner::of(&alice, Some("s1")), &id, &request_ct);
        // Another token, the same token in another session, and a caller
        // without an identity in the same session all miss it.
        assert!(!in_flight.cancel(CallOwner::of(&token_caller("bob"), Some("s1")), &id));
        assert!(!in_flight.cancel(CallOwner::of(&alice, Some("s2")), &id));
        assert!(!in_flight.cancel(CallOwner::of(&alice, None), &id));
        assert!(!in_flight.cancel(CallOwner::of(&Caller::anonymous(), Some("s1")), &id));
        assert!(!token.is_cancelled());
        assert!(in_flight.cancel(CallOwner::of(&alice, Some("s1")), &id));
        assert!(token.is_cancelled());
    }

    #[test]
    fn anonymous_callers_without_a_session_cannot_cancel_each_other() {
        let in_flight = InFlight::default();
        let request_ct = CancellationToken::new();
        let id = RequestId::Number(1);
        let anonymous = Caller::anonymous();
        assert_eq!(CallOwner::of(&anonymous, None), None);
        let (token, entry) = in_flight.register(CallOwner::of(&anonymous, None), &id, &request_ct);
        assert!(entry.is_none());
        assert!(!in_flight.cancel(CallOwner::of(&anonymous, None), &id));
        let other = Caller::unauthenticated(Principal("bearer:0123".into()));
        assert!(!in_flight.cancel(CallOwner::of(&other, None), &id));
        assert!(!token.is_cancelled());
        // Two anonymous sessions are two owners.
        let (token, _entry) =
            in_flight.register(CallOwner::of(&anonymous, Some("s1")), &id, &request_ct);
        assert!(!in_flight.cancel(CallOwner::of(&anonymous, Some("s2")), &id));
        assert!(!token.is_cancelled());
        assert!(in_flight.cancel(CallOwner::of(&anonymous, Some("s1")), &id));
    }
}
