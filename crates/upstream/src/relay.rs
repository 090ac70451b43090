//! Routing what an upstream sends *during* a request back to the downstream
//! caller that made it: progress, log messages, and server-to-client requests
//! (sampling, elicitation, roots) of legacy upstreams.
//!
//! The caller describes itself with a [`CallContext`]: the `_meta` to send
//! upstream (its client capabilities, its log level) and a channel on which it
//! wants [`Relay`] messages. Each upstream request registers a route under its
//! upstream request id and progress token while it is in flight; the client
//! handler looks the route up when a notification or request comes in.
//!
//! `tools/call` reaches the upstream through the broker, which knows nothing of
//! downstream peers: a surface puts the context in the broker's call request,
//! and the broker hands it to [`crate::Upstream::call_tool_with`].
#![allow(deprecated)] // Logging and sampling are deprecated by SEP-2577 but still relayed.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use rmcp::{
    ErrorData, RoleClient,
    model::{
        ClientCapabilities, ClientResult, InputResponses, JsonRpcMessage, LoggingLevel,
        LoggingMessageNotificationParam, ProgressNotificationParam, ProgressToken, RequestId,
        RequestMetaObject, ServerNotification, ServerRequest,
    },
    service::{RxJsonRpcMessage, TxJsonRpcMessage},
    transport::Transport,
};
use tokio::sync::{mpsc, oneshot};

/// Something the upstream sent while a call was in flight, for its caller.
#[derive(Debug)]
pub enum Relay {
    /// A progress notification. Its token is the upstream's; the caller puts
    /// back its own.
    Progress(ProgressNotificationParam),
    /// A log message at or above the call's log level.
    Log(LoggingMessageNotificationParam),
    /// A server-to-client request (`sampling/createMessage`,
    /// `elicitation/create`, `roots/list`) for the caller to answer.
    Request {
        request: ServerRequest,
        reply: oneshot::Sender<Result<ClientResult, ErrorData>>,
    },
}

/// What a downstream caller passes along with one upstream request.
#[derive(Debug, Clone, Default)]
pub struct CallContext {
    /// The downstream client's declared capabilities; sent to 2026-07-28
    /// upstreams in the request `_meta` so that they only ask what the real
    /// client can answer.
    pub client_capabilities: Option<ClientCapabilities>,
    /// Log messages wanted at or above this level (sent as the request's
    /// `_meta` log level to 2026-07-28 upstreams).
    pub log_level: Option<LoggingLevel>,
    /// Where progress, logs and server-to-client requests go. `None` drops
    /// them (and answers requests with an error).
    pub relay: Option<mpsc::UnboundedSender<Relay>>,
    /// MRTR retry (SEP-2322): the answers to the previous `InputRequiredResult`.
    pub input_responses: Option<InputResponses>,
    /// MRTR retry: the `requestState` the upstream sent, echoed unchanged.
    pub request_state: Option<String>,
    /// Cancelled when the caller explicitly cancels its request (MCP
    /// `notifications/cancelled`). A caller that merely goes away does not
    /// cancel: its call completes and is audited.
    pub cancel: Option<tokio_util::sync::CancellationToken>,
    /// The caller's W3C trace context (its request's `_meta.traceparent`,
    /// else its HTTP `traceparent` header): the broker's span joins that
    /// trace.
    pub traceparent: Option<String>,
    /// Whose credentials a per-principal server's request carries: the
    /// caller's principal.
    pub principal: Option<String>,
}

impl CallContext {
    /// The `_meta` for a 2026-07-28 upstream. rmcp fills in the protocol
    /// version and client info and assigns the progress token itself.
    pub(crate) fn modern_meta(&self) -> RequestMetaObject {
        let mut meta = RequestMetaObject::new();
        if let Some(capabilities) = &self.client_capabilities {
            meta.set_client_capabilities(capabilities.clone());
        }
        if let Some(level) = self.log_level {
            meta.set_log_level(level);
        }
        meta
    }
}

/// Numeric severity of a log level (debug = 0 … emergency = 7).
pub fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

struct Route {
    request_id: RequestId,
    progress_token: ProgressToken,
    log_level: Option<LoggingLevel>,
    relay: mpsc::UnboundedSender<Relay>,
}

/// The in-flight requests of one upstream connection that want relays.
#[derive(Default)]
pub(crate) struct Routes {
    next: AtomicU64,
    routes: Mutex<HashMap<u64, Route>>,
    /// In-flight requests, with or without a relay: an unassociated message
    /// is only routed when exactly one request is in flight.
    in_flight: AtomicU64,
}

/// Wraps an upstream transport so that progress and log notifications are
/// routed as they are read. rmcp hands notifications to spawned tasks, which
/// may run after the response that followed them on the wire has been
/// delivered; routed here, a caller hears them first, in the upstream's order.
pub(crate) struct RelayInOrder<T> {
    inner: T,
    routes: Arc<Routes>,
}

impl<T> RelayInOrder<T> {
    pub(crate) fn new(inner: T, routes: &Arc<Routes>) -> Self {
        Self {
            inner,
            routes: Arc::clone(routes),
        }
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for RelayInOrder<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let message = self.inner.receive().await?;
        if let JsonRpcMessage::Notification(note) = &message {
            match &note.notification {
                ServerNotification::ProgressNotification(n) => {
                    self.routes.progress(n.params.clone());
                }
                ServerNotification::LoggingMessageNotification(n) => {
                    self.routes.log(n.params.clone());
                }
                _ => {}
            }
        }
        Some(message)
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// Removes its route when the request finishes or is dropped.
pub(crate) struct RouteGuard<'a> {
    routes: &'a Routes,
    key: Option<u64>,
}

impl Drop for RouteGuard<'_> {
    fn drop(&mut self) {
        self.routes.in_flight.fetch_sub(1, Ordering::SeqCst);
        if let Some(key) = self.key {
            self.routes.lock().remove(&key);
        }
    }
}

impl Routes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Route>> {
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn register(
        &self,
        request_id: RequestId,
        progress_token: ProgressToken,
        context: &CallContext,
    ) -> RouteGuard<'_> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let key = context.relay.clone().map(|relay| {
            let key = self.next.fetch_add(1, Ordering::SeqCst);
            self.lock().insert(
                key,
                Route {
                    request_id,
                    progress_token,
                    log_level: context.log_level,
                    relay,
                },
            );
            key
        });
        RouteGuard { routes: self, key }
    }

    /// The relay of the request that owns `token`.
    pub(crate) fn progress(&self, params: ProgressNotificationParam) {
        let routes = self.lock();
        if let Some(route) = routes
            .values()
            .find(|r| r.progress_token == params.progress_token)
        {
            let _ = route.relay.send(Relay::Progress(params));
        }
    }

    /// Log messages carry no request id. They go to the one request in
    /// flight, if it asked for that level; with several in flight the owner
    /// is unknown and the message is dropped rather than shown to the wrong
    /// caller.
    pub(crate) fn log(&self, params: LoggingMessageNotificationParam) {
        if self.in_flight.load(Ordering::SeqCst) != 1 {
            tracing::debug!("upstream log message dropped: no single request in flight");
            return;
        }
        let routes = self.lock();
        let mut candidates = routes.values();
        if let (Some(route), None) = (candidates.next(), candidates.next())
            && route
                .log_level
                .is_some_and(|min| severity(params.level) >= severity(min))
        {
            let _ = route.relay.send(Relay::Log(params));
        }
    }

    /// The relay for a server-to-client request: the request it was sent on
    /// (HTTP upstreams say which), else the one request in flight.
    pub(crate) fn for_request(
        &self,
        associated: Option<&RequestId>,
    ) -> Option<mpsc::UnboundedSender<Relay>> {
        let routes = self.lock();
        if let Some(id) = associated {
            return routes
                .values()
                .find(|r| &r.request_id == id)
                .map(|r| r.relay.clone());
        }
        if self.in_flight.load(Ordering::SeqCst) != 1 {
            return None;
        }
        let mut candidates = routes.values();
        match (candidates.next(), candidates.next()) {
            (Some(route), None) => Some(route.relay.clone()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(level: Option<LoggingLevel>) -> (CallContext, mpsc::UnboundedReceiver<Relay>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let context = CallContext {
            log_level: level,
            relay: Some(tx),
            ..CallContext::default()
        };
        (context, rx)
    }

    fn log(level: LoggingLevel) -> LoggingMessageNotificationParam {
        LoggingMessageNotificationParam::new(level, serde_json::json!("hello"))
    }

    #[test]
    fn progress_goes_to_the_request_that_owns_the_token() {
        let routes = Routes::default();
        let (a, mut rx_a) = context(None);
        let (b, mut rx_b) = context(None);
        let token_a = ProgressToken(rmcp::model::NumberOrString::Number(1));
        let token_b = ProgressToken(rmcp::model::NumberOrString::Number(2));
        let _ga = routes.register(RequestId::Number(1), token_a, &a);
        let _gb = routes.register(RequestId::Number(2), token_b.clone(), &b);
        routes.progress(ProgressNotificationParam::new(token_b, 50.0));
        assert!(matches!(rx_b.try_recv(), Ok(Relay::Progress(p)) if p.progress == 50.0));
        assert!(rx_a.try_recv().is_err());
    }

    #[test]
    fn logs_reach_a_lone_request_at_or_above_its_level_only() {
        let routes = Routes::default();
        let (a, mut rx_a) = context(Some(LoggingLevel::Info));
        let token = |n| ProgressToken(rmcp::model::NumberOrString::Number(n));
        let guard = routes.register(RequestId::Number(1), token(1), &a);
        routes.log(log(LoggingLevel::Debug));
        assert!(rx_a.try_recv().is_err(), "below the level");
        routes.log(log(LoggingLevel::Warning));
        assert!(matches!(rx_a.try_recv(), Ok(Relay::Log(_))));
        // With two requests in flight the owner is unknown: nobody gets it.
        let (b, mut rx_b) = context(Some(LoggingLevel::Debug));
        let _gb = routes.register(RequestId::Number(2), token(2), &b);
        routes.log(log(LoggingLevel::Error));
        assert!(rx_a.try_recv().is_err() && rx_b.try_recv().is_err());
        drop(guard);
        routes.log(log(LoggingLevel::Error));
        assert!(matches!(rx_b.try_recv(), Ok(Relay::Log(_))));
        // Server-to-client requests: by association, else the lone request.
        assert!(routes.for_request(Some(&RequestId::Number(2))).is_some());
        assert!(routes.for_request(Some(&RequestId::Number(1))).is_none());
        assert!(routes.for_request(None).is_some());
    }
}
