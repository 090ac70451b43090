//! Streamable HTTP at `/mcp`: stateless for 2026-07-28 clients; for
//! 2025-11-25 clients session-free by default, or with legacy sessions, which
//! the server-to-client requests of sampling and elicitation (and log and
//! progress notifications outside a request's stream) need.

use std::{
    convert::Infallible,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use axum::{Router, middleware, routing::get};
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;
use tower_http::limit::RequestBodyLimitLayer;

use super::{
    admission::AdmissionState,
    auth::{AuthState, METADATA_PATH, StepUpState, protected_resource},
    guard::{self, Guard},
    pipeline::{self, Pipeline},
};
use crate::{Gateway, GatewayState};

/// The gateway's HTTP routes. `allowed_hosts` guards against DNS rebinding;
/// loopback names are always allowed. `legacy_sessions` gives legacy
/// (initialize) clients a session (`Mcp-Session-Id`, GET stream, DELETE);
/// without it GET and DELETE are 405 with `Allow: POST`. `extra` routes (the
/// binary's `/metrics`) sit behind the same guard as every other route.
pub fn router(
    state: Arc<GatewayState>,
    allowed_hosts: Vec<String>,
    legacy_sessions: bool,
    shutdown: CancellationToken,
    extra: Router,
) -> Router {
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    hosts.extend(allowed_hosts);
    let guard = Guard {
        hosts: hosts.clone(),
        max_body_bytes: state.config.max_body_bytes,
    };
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(legacy_sessions)
        // Plain JSON for a request that sends nothing before its result; rmcp
        // switches to SSE when progress or logs come first.
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_allowed_hosts(hosts)
        .with_cancellation_token(shutdown.clone());
    let auth = AuthState {
        governance: Arc::clone(state.governance()),
        auth: state.auth.clone(),
    };
    let health = super::health::routes(Arc::clone(&state));
    let provider_api = crate::provider::api::routes(Arc::clone(&state), auth.clone());
    let admin = crate::admin::routes(Arc::clone(&state), auth.clone(), shutdown.clone());
    let console = crate::console::routes(Arc::clone(&state), auth.clone());
    let oauth_callback = crate::provider::oauth_callback::routes(Arc::clone(&state));
    let guard = Arc::new(guard);
    let pipeline = Pipeline {
        guard: Arc::clone(&guard),
        auth: auth.clone(),
        requests: Arc::clone(&state.requests),
        step_up: StepUpState {
            auth: state.auth.clone(),
            mode: state.config.mode,
        },
        admission: AdmissionState {
            admission: Arc::clone(&state.admission),
            mode: state.config.mode,
        },
        // Session-free legacy calls only: with sessions on, rmcp owns them.
        fast_calls: (state.config.fast_calls
            && state.config.mode == crate::Mode::Direct
            && !legacy_sessions)
            .then(|| Arc::clone(&state)),
    };
    let service = SharedMcp(Arc::new(StreamableHttpService::new(
        move || Ok(Gateway::new(Arc::clone(&state))),
        Arc::new(LocalSessionManager::default()),
        config,
    )));
    // `/mcp`'s layers composed here, not by the router: a router's layer
    // wraps each route in one more boxed service, and axum clones the whole
    // chain of them for every request, at every level (its clones were a
    // tenth of a call's allocations). The guard and the body limit are the
    // pipeline's first step, not layers of their own: each layer boxed its
    // future.
    let mcp = ServiceBuilder::new()
        .layer(middleware::from_fn_with_state(
            Arc::new(pipeline),
            pipeline::mcp,
        ))
        .service(service);
    Router::new()
        .route(METADATA_PATH, get(protected_resource))
        .route(&format!("{METADATA_PATH}/mcp"), get(protected_resource))
        .with_state(auth.clone())
        .merge(admin)
        .merge(console)
        .merge(oauth_callback)
        .merge(health)
        .merge(provider_api)
        .merge(extra)
        // A body without a declared length is cut off at the limit while read.
        .layer(RequestBodyLimitLayer::new(guard.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&guard),
            guard::guard,
        ))
        // After the layers above, which wrap only the routes before them:
        // `/mcp`'s pipeline makes the same two checks first. These are the paths
        // `nest_service("/mcp")` served before.
        .route_service("/mcp", mcp.clone())
        .route_service("/mcp/", mcp.clone())
        .route_service("/mcp/{*rest}", mcp)
}

/// rmcp's service behind an `Arc`. axum clones a route's service, and the
/// state of every layer around it, for each request at each level of
/// nesting; rmcp's clone copies its config's lists each time (about forty
/// allocations a request, before any of it was used).
#[derive(Clone)]
struct SharedMcp(Arc<StreamableHttpService<Gateway, LocalSessionManager>>);

impl tower::Service<axum::extract::Request> for SharedMcp {
    type Response = axum::http::Response<McpBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::extract::Request) -> Self::Future {
        let service = Arc::clone(&self.0);
        Box::pin(async move { Ok(service.handle(request).await) })
    }
}

/// The body of rmcp's answers.
type McpBody = http_body_util::combinators::BoxBody<bytes::Bytes, Infallible>;
