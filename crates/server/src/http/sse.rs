//! Legacy HTTP+SSE clients (the 2024-11-05 transport): `GET /sse` opens an
//! event stream whose first `endpoint` event names
//! `/messages?session_id=…`, where the client POSTs its messages; replies
//! and everything else the gateway says go out on the stream.
//!
//! Each stream is one rmcp session of the same [`Gateway`] handler `/mcp`
//! serves, and each POST takes `/mcp`'s steps: the guard (the router's
//! layer), who is calling, the body read and tracked, step-up and admission.
//! The caller goes in with every message, so no message is handled as
//! anybody else. A session belongs to whoever opened it: a POST with other
//! credentials is refused. Sessions live in this replica's memory.
//!
//! Bounded: at most `max_sessions` streams; a stream without a message
//! either way for `idle_timeout` closes; a client that stops reading is
//! dropped once its stream's buffer stays full for `stall_timeout`.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Router,
    body::Body,
    extract::{Query, Request, State},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use bytes::Bytes;
use manifold_broker::Caller;
use rmcp::{
    RoleServer, ServiceExt,
    model::{ClientJsonRpcMessage, ClientNotification, GetExtensions, ServerJsonRpcMessage},
    transport::Transport,
};
use serde::Deserialize;
use serde_json::json;
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{
    admission::{self, AdmissionState, Admitted},
    auth::{self, AuthState, StepUpState},
    requests::{self, InFlight},
};
use crate::{Gateway, GatewayState};

pub(crate) const STREAM_PATH: &str = "/sse";
pub(crate) const MESSAGES_PATH: &str = "/messages";

/// Bounds on legacy SSE sessions (`[gateway] max_sse_sessions`,
/// `sse_idle_timeout_seconds`).
#[derive(Debug, Clone, Copy)]
pub struct SseLimits {
    pub max_sessions: usize,
    pub idle_timeout: Duration,
    /// A stream whose buffer stays full this long has a client that stopped
    /// reading.
    pub stall_timeout: Duration,
    /// Messages buffered for a stream.
    pub buffered: usize,
}

impl Default for SseLimits {
    fn default() -> Self {
        Self {
            max_sessions: 256,
            idle_timeout: Duration::from_secs(300),
            stall_timeout: Duration::from_secs(10),
            buffered: 64,
        }
    }
}

/// Between a keep-alive comment and the next: proxies keep the stream open,
/// and a client that went away is noticed when the write fails.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Messages a POST may queue ahead of the session's handler.
const INBOUND: usize = 32;

pub(crate) struct SseState {
    pub state: Arc<GatewayState>,
    pub auth: AuthState,
    pub step_up: StepUpState,
    pub admission: AdmissionState,
    pub shutdown: CancellationToken,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
}

impl SseState {
    pub(crate) fn new(
        state: Arc<GatewayState>,
        auth: AuthState,
        step_up: StepUpState,
        admission: AdmissionState,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            state,
            auth,
            step_up,
            admission,
            shutdown,
            sessions: Mutex::default(),
        }
    }

    fn limits(&self) -> SseLimits {
        self.state.config.sse
    }

    fn session(&self, id: &str) -> Option<Arc<Session>> {
        self.sessions
            .lock()
            .expect("sessions lock")
            .get(id)
            .cloned()
    }
}

pub(crate) fn routes(sse: Arc<SseState>) -> Router {
    Router::new()
        .route(STREAM_PATH, get(open))
        .route(MESSAGES_PATH, post(message))
        .with_state(sse)
}

/// Who a session belongs to: the caller's token or user; `None` for an
/// anonymous caller (auth off), whose session is its unguessable id.
fn owner_of(caller: &Caller) -> Option<String> {
    match (caller.token_id(), caller.user_id()) {
        (Some(token), _) => Some(format!("token:{token}")),
        (None, Some(user)) => Some(format!("user:{user}")),
        (None, None) => None,
    }
}

struct Session {
    id: String,
    owner: Option<String>,
    inbound: mpsc::Sender<ClientJsonRpcMessage>,
    /// Cancelled when the session ends, for whatever reason.
    closed: CancellationToken,
    last_active: Mutex<Instant>,
    /// What a request holds until its reply goes out on the stream: its
    /// place among the requests in flight, and its admission slot.
    held: Mutex<HashMap<String, Held>>,
}

struct Held {
    in_flight: Option<InFlight>,
    _admitted: Option<Admitted>,
}

impl Session {
    fn touch(&self) {
        *self.last_active.lock().expect("activity lock") = Instant::now();
    }

    fn idle_until(&self, idle: Duration) -> Instant {
        *self.last_active.lock().expect("activity lock") + idle
    }

    fn hold(&self, id: &rmcp::model::RequestId, held: Held) {
        self.held
            .lock()
            .expect("held lock")
            .insert(id.to_string(), held);
    }

    fn release(&self, id: &rmcp::model::RequestId) {
        let held = self.held.lock().expect("held lock").remove(&id.to_string());
        if let Some(Held {
            in_flight: Some(mut in_flight),
            ..
        }) = held
        {
            in_flight.set_status(StatusCode::OK.as_u16());
        }
    }
}

/// `GET /sse`: a new session, if the caller is admitted and there is room.
async fn open(State(sse): State<Arc<SseState>>, request: Request) -> Response {
    let (caller, _rows) = match auth::caller_of(&sse.auth, request.headers()).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let limits = sse.limits();
    let (inbound, inbound_rx) = mpsc::channel(INBOUND);
    let (outbound, outbound_rx) = mpsc::channel(limits.buffered.max(1));
    let session = {
        let mut sessions = sse.sessions.lock().expect("sessions lock");
        if sessions.len() >= limits.max_sessions {
            return sessions_full(limits.max_sessions);
        }
        let session = Arc::new(Session {
            id: session_id(),
            owner: owner_of(&caller),
            inbound,
            closed: sse.shutdown.child_token(),
            last_active: Mutex::new(Instant::now()),
            held: Mutex::default(),
        });
        sessions.insert(session.id.clone(), Arc::clone(&session));
        session
    };
    metrics::gauge!("manifold_sse_sessions").increment(1.0);
    let transport = ServerSide {
        session: Arc::clone(&session),
        inbound: inbound_rx,
        outbound,
        stall_timeout: limits.stall_timeout,
    };
    tokio::spawn(run_session(
        Arc::clone(&sse),
        Arc::clone(&session),
        transport,
    ));
    let endpoint = format!("{MESSAGES_PATH}?session_id={}", session.id);
    let body = event_stream(&endpoint, outbound_rx, session.closed.clone());
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// The session's handler until it ends: the client leaves, the stream
/// idles out or stalls, or the gateway shuts down.
async fn run_session(sse: Arc<SseState>, session: Arc<Session>, transport: ServerSide) {
    let gateway = Gateway::new(Arc::clone(&sse.state));
    let idle = sse.limits().idle_timeout;
    let idle_out = async {
        loop {
            let until = session.idle_until(idle);
            if Instant::now() >= until {
                tracing::debug!(session = %session.id, "legacy SSE session idle; closing");
                return;
            }
            tokio::time::sleep_until(until).await;
        }
    };
    let served = async {
        match gateway
            .serve_with_ct(transport, session.closed.clone())
            .await
        {
            Ok(running) => {
                let _ = running.waiting().await;
            }
            Err(error) => {
                tracing::debug!(session = %session.id, %error, "legacy SSE session ended before initialize");
            }
        }
    };
    tokio::select! {
        () = served => {}
        () = idle_out => {}
        () = session.closed.cancelled() => {}
    }
    session.closed.cancel();
    session.held.lock().expect("held lock").clear();
    sse.sessions
        .lock()
        .expect("sessions lock")
        .remove(&session.id);
    metrics::gauge!("manifold_sse_sessions").decrement(1.0);
}

/// The stream's bytes: the `endpoint` event, then each message, with
/// keep-alive comments between. Dropped (the client went away) or ended, it
/// closes the session.
fn event_stream(
    endpoint: &str,
    messages: mpsc::Receiver<ServerJsonRpcMessage>,
    closed: CancellationToken,
) -> impl futures::Stream<Item = Result<Bytes, std::convert::Infallible>> + Send + 'static {
    let first = Bytes::from(format!("event: endpoint\ndata: {endpoint}\n\n"));
    let state = (Some(first), messages, closed.clone().drop_guard());
    futures::stream::unfold(state, move |(first, mut messages, guard)| {
        let closed = closed.clone();
        async move {
            if let Some(first) = first {
                return Some((Ok(first), (None, messages, guard)));
            }
            let event = tokio::select! {
                message = messages.recv() => {
                    let message = message?;
                    let data = serde_json::to_string(&message).ok()?;
                    format!("event: message\ndata: {data}\n\n")
                }
                () = tokio::time::sleep(KEEP_ALIVE) => ":\n\n".to_string(),
                () = closed.cancelled() => return None,
            };
            Some((Ok(Bytes::from(event)), (None, messages, guard)))
        }
    })
}

#[derive(Deserialize)]
struct SessionQuery {
    session_id: String,
}

/// `POST /messages?session_id=…`: one client message into its session.
async fn message(
    State(sse): State<Arc<SseState>>,
    Query(query): Query<SessionQuery>,
    mut request: Request,
) -> Response {
    let (caller, _rows) = match auth::caller_of(&sse.auth, request.headers()).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let Some(session) = sse.session(&query.session_id) else {
        return refusal(
            StatusCode::NOT_FOUND,
            "no_such_session",
            "no open SSE session has this id on this replica",
        );
    };
    if owner_of(&caller) != session.owner {
        return refusal(
            StatusCode::FORBIDDEN,
            "session_of_another_caller",
            "this SSE session was opened with other credentials",
        );
    }
    request.extensions_mut().insert(caller);
    // The session names the caller's MCP session: cancellation finds the
    // caller's calls by it, as for `/mcp`'s `Mcp-Session-Id`.
    if let Ok(id) = HeaderValue::from_str(&session.id) {
        request.headers_mut().insert("mcp-session-id", id);
    }
    let (request, in_flight) = match requests::read(&sse.state.requests, request).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    if let Some(refused) = auth::step_up_refusal(&sse.step_up, &request) {
        return refused;
    }
    let parsed = request.extensions().get::<requests::Parsed>();
    let admitted = match admission::admit_discovery(&sse.admission, parsed).await {
        Ok(admitted) => admitted,
        Err(busy) => return busy,
    };
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let Ok(mut message) = serde_json::from_slice::<ClientJsonRpcMessage>(&bytes) else {
        return refusal(
            StatusCode::BAD_REQUEST,
            "not_a_message",
            "the body is not one JSON-RPC message",
        );
    };
    match &mut message {
        ClientJsonRpcMessage::Request(request) => {
            session.hold(
                &request.id,
                Held {
                    in_flight,
                    _admitted: admitted,
                },
            );
            request.request.extensions_mut().insert(parts);
        }
        ClientJsonRpcMessage::Notification(notification) => {
            // A cancelled request may never be answered: what it held
            // goes now rather than at the session's end.
            if let ClientNotification::CancelledNotification(cancelled) = &notification.notification
                && let Some(id) = &cancelled.params.request_id
            {
                session.release(id);
            }
            notification.notification.extensions_mut().insert(parts);
        }
        _ => {}
    }
    session.touch();
    let stall = sse.limits().stall_timeout;
    match session.inbound.send_timeout(message, stall).await {
        Ok(()) => (StatusCode::ACCEPTED, "Accepted").into_response(),
        Err(_) => refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "session_closed",
            "the SSE session is closed or not reading",
        ),
    }
}

fn refusal(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"error": code, "message": message})),
    )
        .into_response()
}

fn sessions_full(max: usize) -> Response {
    let mut response = refusal(
        StatusCode::SERVICE_UNAVAILABLE,
        "sse_sessions_full",
        &format!(
            "this replica has {max} legacy SSE streams open ([gateway] max_sse_sessions); try again later, or use Streamable HTTP at /mcp"
        ),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    response
}

fn session_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the OS random source works");
    hex::encode(bytes)
}

/// The session's end of rmcp: messages the POSTs bring in, and what the
/// handler sends out to the stream.
struct ServerSide {
    session: Arc<Session>,
    inbound: mpsc::Receiver<ClientJsonRpcMessage>,
    outbound: mpsc::Sender<ServerJsonRpcMessage>,
    stall_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
#[error("the legacy SSE session is closed")]
struct SessionClosed;

impl Transport<RoleServer> for ServerSide {
    type Error = SessionClosed;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let session = Arc::clone(&self.session);
        let outbound = self.outbound.clone();
        let stall = self.stall_timeout;
        async move {
            let replied = match &item {
                ServerJsonRpcMessage::Response(response) => Some(response.id.clone()),
                ServerJsonRpcMessage::Error(error) => error.id.clone(),
                _ => None,
            };
            session.touch();
            let sent = outbound.send_timeout(item, stall).await;
            if let Some(id) = replied {
                session.release(&id);
            }
            if sent.is_err() {
                // The client stopped reading (or left): drop it rather than
                // buffer without end.
                tracing::debug!(session = %session.id, "legacy SSE client not reading; closing");
                session.closed.cancel();
                return Err(SessionClosed);
            }
            Ok(())
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<ClientJsonRpcMessage>> + Send {
        let closed = self.session.closed.clone();
        let inbound = &mut self.inbound;
        async move {
            tokio::select! {
                message = inbound.recv() => message,
                () = closed.cancelled() => None,
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.session.closed.cancel();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use axum::{body::Body, http::Request};
    use http_body_util::BodyExt;
    use manifold_broker::Governance;
    use manifold_catalog::ToolCatalog;
    use manifold_store::{Action, NewToken, Store};
    use tokio_util::sync::CancellationToken;
    use tower::ServiceExt;

    use super::*;
    use crate::GatewayParts;

    const DEADLINE: Duration = Duration::from_secs(10);

    /// The whole router (guard included) over an empty catalog, and a
    /// token with `actions` for each entry.
    async fn gateway(
        limits: SseLimits,
        auth_required: bool,
        tokens: &[&[Action]],
    ) -> (Router, Vec<String>) {
        let store = Store::connect("sqlite::memory:").await.unwrap();
        let mut secrets = Vec::new();
        for (i, actions) in tokens.iter().enumerate() {
            let new = NewToken::new(format!("t{i}"), actions.iter().copied(), ["*"]);
            secrets.push(store.create_token(new).await.unwrap().1);
        }
        let mut parts = GatewayParts::new(
            ToolCatalog::new(Vec::new(), true),
            Governance::new(store, Default::default()),
        );
        parts.config.sse = limits;
        parts.config.mode = crate::Mode::Direct;
        parts.auth.required = auth_required;
        let state = GatewayState::new(parts);
        let router = crate::http::router(
            state,
            Vec::new(),
            false,
            CancellationToken::new(),
            Router::new(),
        );
        (router, secrets)
    }

    /// One open `/sse` stream, read event by event.
    struct Stream {
        body: Body,
        pending: String,
    }

    impl Stream {
        /// The next `(event, data)`, or `None` when the stream ended.
        async fn next(&mut self) -> Option<(String, String)> {
            tokio::time::timeout(DEADLINE, async {
                loop {
                    if let Some(end) = self.pending.find("\n\n") {
                        let raw: String = self.pending.drain(..end + 2).collect();
                        let field = |name: &str| {
                            raw.lines()
                                .find_map(|l| l.strip_prefix(name))
                                .map(|v| v.trim().to_string())
                        };
                        if let Some(data) = field("data:") {
                            return Some((field("event:").unwrap_or_default(), data));
                        }
                        continue;
                    }
                    let frame = self.body.frame().await?.ok()?;
                    if let Ok(data) = frame.into_data() {
                        self.pending.push_str(&String::from_utf8_lossy(&data));
                    }
                }
            })
            .await
            .expect("an event or the end within the deadline")
        }
    }

    async fn open_stream(
        router: &Router,
        token: Option<&str>,
    ) -> Result<(Stream, String), Response> {
        let mut request = Request::get(STREAM_PATH).header(header::HOST, "localhost");
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let response = router
            .clone()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        if response.status() != StatusCode::OK {
            return Err(response);
        }
        let mut stream = Stream {
            body: response.into_body(),
            pending: String::new(),
        };
        let (event, endpoint) = stream.next().await.expect("the endpoint event");
        assert_eq!(event, "endpoint");
        assert!(endpoint.starts_with("/messages?session_id="), "{endpoint}");
        Ok((stream, endpoint))
    }

    async fn post(
        router: &Router,
        endpoint: &str,
        token: Option<&str>,
        body: serde_json::Value,
    ) -> (StatusCode, String) {
        let mut request = Request::post(endpoint)
            .header(header::HOST, "localhost")
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let response = router
            .clone()
            .oneshot(request.body(Body::from(body.to_string())).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    fn initialize(id: u64) -> serde_json::Value {
        json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
            "protocolVersion": "2024-11-05", "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"}}})
    }

    async fn wait_until_gone(router: &Router, endpoint: &str) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let ping = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
            let (status, _) = post(router, endpoint, None, ping).await;
            if status == StatusCode::NOT_FOUND {
                return;
            }
            assert!(Instant::now() < deadline, "the session is still open");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_session_answers_on_its_stream_in_the_version_the_client_asked() {
        let (router, _) = gateway(SseLimits::default(), false, &[]).await;
        let (mut stream, endpoint) = open_stream(&router, None).await.unwrap();
        let (status, _) = post(&router, &endpoint, None, initialize(1)).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        let (event, data) = stream.next().await.unwrap();
        assert_eq!(event, "message");
        let reply: serde_json::Value = serde_json::from_str(&data).unwrap();
        assert_eq!(reply["id"], 1);
        assert_eq!(reply["result"]["protocolVersion"], "2024-11-05");
    }

    #[tokio::test]
    async fn past_max_sse_sessions_a_stream_is_refused_with_503() {
        let limits = SseLimits {
            max_sessions: 1,
            ..SseLimits::default()
        };
        let (router, _) = gateway(limits, false, &[]).await;
        let (first, endpoint) = open_stream(&router, None).await.unwrap();
        let refused = open_stream(&router, None).await.err().expect("refused");
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = refused.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&body).contains("sse_sessions_full"));
        // The client that leaves makes room.
        drop(first);
        wait_until_gone(&router, &endpoint).await;
        assert!(open_stream(&router, None).await.is_ok());
    }

    #[tokio::test]
    async fn a_client_that_stops_reading_is_dropped() {
        let limits = SseLimits {
            buffered: 1,
            stall_timeout: Duration::from_millis(200),
            ..SseLimits::default()
        };
        let (router, _) = gateway(limits, false, &[]).await;
        let (_unread, endpoint) = open_stream(&router, None).await.unwrap();
        post(&router, &endpoint, None, initialize(1)).await;
        // Replies pile up unread: past the buffer and the grace, the
        // session is closed rather than buffered without end.
        for id in 2..6 {
            let ping = json!({"jsonrpc": "2.0", "id": id, "method": "ping"});
            post(&router, &endpoint, None, ping).await;
        }
        wait_until_gone(&router, &endpoint).await;
    }

    #[tokio::test]
    async fn an_idle_stream_closes() {
        let limits = SseLimits {
            idle_timeout: Duration::from_millis(300),
            ..SseLimits::default()
        };
        let (router, _) = gateway(limits, false, &[]).await;
        let (mut stream, endpoint) = open_stream(&router, None).await.unwrap();
        assert_eq!(stream.next().await, None, "the idle stream ended");
        wait_until_gone(&router, &endpoint).await;
    }

    #[tokio::test]
    async fn a_session_is_its_openers_and_no_message_is_anonymous() {
        let (router, tokens) = gateway(
            SseLimits::default(),
            true,
            &[&[Action::Discover], &[Action::Call]],
        )
        .await;
        let (owner, other) = (tokens[0].as_str(), tokens[1].as_str());
        let refused = open_stream(&router, None).await.err().expect("no token");
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        let (mut stream, endpoint) = open_stream(&router, Some(owner)).await.unwrap();
        let (status, _) = post(&router, &endpoint, None, initialize(1)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, body) = post(&router, &endpoint, Some(other), initialize(1)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert!(body.contains("session_of_another_caller"), "{body}");
        let (status, _) = post(&router, &endpoint, Some(owner), initialize(1)).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        stream.next().await.expect("the initialize result");
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        post(&router, &endpoint, Some(owner), initialized).await;
        // The owner's token may not call: were the message anybody's but
        // its (anonymous, say), the call would pass to the name lookup.
        let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "nobody__nothing", "arguments": {}}});
        let (status, _) = post(&router, &endpoint, Some(owner), call).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        let (_, reply) = stream.next().await.expect("the call's reply");
        assert!(reply.contains("\"id\":2"), "{reply}");
        assert!(reply.contains("action_not_allowed"), "{reply}");
        assert!(
            !reply.contains("nobody__nothing"),
            "refused before the lookup: {reply}"
        );
    }

    #[tokio::test]
    async fn a_message_over_the_body_limit_is_refused() {
        let (router, _) = gateway(SseLimits::default(), false, &[]).await;
        let (_stream, endpoint) = open_stream(&router, None).await.unwrap();
        let limit = crate::SurfaceConfig::default().max_body_bytes;
        let padding = "x".repeat(limit);
        let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"_meta": {"pad": padding}}});
        let (status, _) = post(&router, &endpoint, None, ping).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[tokio::test]
    async fn both_routes_are_behind_the_host_guard() {
        let (router, _) = gateway(SseLimits::default(), false, &[]).await;
        for request in [
            Request::get(STREAM_PATH),
            Request::post(format!("{MESSAGES_PATH}?session_id=x")),
        ] {
            let request = request
                .header(header::HOST, "evil.example")
                .body(Body::empty())
                .unwrap();
            let response = router.clone().oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::FORBIDDEN);
        }
    }
}
