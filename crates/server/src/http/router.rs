//! Every route the gateway serves. All of them are behind the guard
//! (`guard.rs`; the probes skip its `Host` check): the surfaces as one
//! router under the guard's layer, and `/mcp` by its pipeline's first step.
//!
//! Legacy HTTP+SSE at `/sse` and `/messages` (`sse.rs`), as a surface under
//! the guard's layer. Streamable HTTP at `/mcp`: stateless for 2026-07-28 clients; for
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
    health,
    pipeline::{self, Pipeline},
    sse::{self, SseState},
};
use crate::{
    Gateway, GatewayState,
    provider::{api, oauth_callback, sign_in},
};

/// The gateway's HTTP routes. `allowed_hosts` guards against DNS rebinding;
/// loopback names are always allowed. `legacy_sessions` gives legacy
/// (initialize) clients a session (`Mcp-Session-Id`, GET stream, DELETE);
/// without it GET and DELETE are 405 with `Allow: POST`. `extra` routes (the
/// binary's `/metrics`) sit behind the guard with every other surface.
pub fn router(
    state: Arc<GatewayState>,
    allowed_hosts: Vec<String>,
    legacy_sessions: bool,
    shutdown: CancellationToken,
    extra: Router,
) -> Router {
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    hosts.extend(allowed_hosts);
    let guard = Arc::new(Guard {
        hosts: hosts.clone(),
        max_body_bytes: state.config.max_body_bytes,
    });
    let auth = AuthState {
        governance: Arc::clone(state.governance()),
        auth: state.auth.clone(),
    };
    let legacy_sse = Arc::new(SseState::new(
        Arc::clone(&state),
        auth.clone(),
        StepUpState {
            auth: auth.auth.clone(),
            mode: state.config.mode,
        },
        AdmissionState {
            admission: Arc::clone(&state.admission),
            mode: state.config.mode,
        },
        shutdown.clone(),
    ));
    let surfaces = surfaces(&state, &auth, &shutdown, extra).merge(sse::routes(legacy_sse));
    let mcp = mcp(state, guard.clone(), auth, hosts, legacy_sessions, shutdown);
    // The paths `nest_service("/mcp")` would serve.
    guarded(surfaces, &guard)
        .route_service("/mcp", mcp.clone())
        .route_service("/mcp/", mcp.clone())
        .route_service("/mcp/{*rest}", mcp)
}

/// Every route but `/mcp`'s: the protected-resource metadata, the admin API
/// and its OpenAPI document, console, provider API, OAuth callback, probes
/// and `extra`.
fn surfaces(
    state: &Arc<GatewayState>,
    auth: &AuthState,
    shutdown: &CancellationToken,
    extra: Router,
) -> Router {
    Router::new()
        .route(METADATA_PATH, get(protected_resource))
        .route(&format!("{METADATA_PATH}/mcp"), get(protected_resource))
        .with_state(auth.clone())
        .merge(crate::admin::routes(
            Arc::clone(state),
            auth.clone(),
            shutdown.clone(),
        ))
        .merge(crate::admin::openapi::routes())
        .merge(crate::console::routes(Arc::clone(state), auth.clone()))
        .merge(oauth_callback::routes(Arc::clone(state)))
        .merge(sign_in::routes(Arc::clone(state)))
        .merge(health::routes(Arc::clone(state)))
        .merge(api::routes(Arc::clone(state), auth.clone()))
        .merge(extra)
}

/// `routes` as a whole behind the guard, its fallback (404) included: the
/// `Host`, `Origin` and size checks, and the body cut off at the limit while
/// read when it declares no length.
fn guarded(routes: Router, guard: &Arc<Guard>) -> Router {
    routes
        .layer(RequestBodyLimitLayer::new(guard.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            Arc::clone(guard),
            guard::guard,
        ))
}

/// `/mcp`: rmcp's Streamable HTTP service behind the pipeline, whose first
/// step is the guard's checks.
fn mcp(
    state: Arc<GatewayState>,
    guard: Arc<Guard>,
    auth: AuthState,
    hosts: Vec<String>,
    legacy_sessions: bool,
    shutdown: CancellationToken,
) -> impl tower::Service<
    axum::extract::Request,
    Response = axum::response::Response,
    Error = Infallible,
    Future: Send,
> + Clone
+ Send
+ Sync
+ 'static {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(legacy_sessions)
        // Plain JSON for a request that sends nothing before its result; rmcp
        // switches to SSE when progress or logs come first.
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_allowed_hosts(hosts)
        .with_cancellation_token(shutdown);
    let pipeline = Pipeline {
        guard,
        step_up: StepUpState {
            auth: auth.auth.clone(),
            mode: state.config.mode,
        },
        auth,
        requests: Arc::clone(&state.requests),
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
    ServiceBuilder::new()
        .layer(middleware::from_fn_with_state(
            Arc::new(pipeline),
            pipeline::mcp,
        ))
        .service(service)
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

#[cfg(test)]
mod tests {
    use axum::{
        body::Body,
        http::{Request, StatusCode, header},
    };
    use manifold_broker::Governance;
    use manifold_catalog::ToolCatalog;
    use manifold_store::Store;
    use tower::ServiceExt;

    use super::*;
    use crate::GatewayParts;

    /// Every path `router` serves, read from the router itself: axum keeps
    /// no public list of its routes, but its `Debug` names each route's path
    /// as `RouteId(n): "/path"`. The routes come before the fallback's.
    fn served_paths(router: &Router) -> Vec<String> {
        let debug = format!("{router:?}");
        let routes = debug
            .split_once("fallback_router")
            .map_or(debug.as_str(), |(routes, _)| routes);
        let mut paths: Vec<String> = routes
            .split("RouteId(")
            .skip(1)
            .filter_map(|rest| {
                let (_, path) = rest.split_once("): \"")?;
                Some(path.split_once('"')?.0.to_string())
            })
            .collect();
        paths.sort();
        paths.dedup();
        paths
    }

    /// A request path that `path`'s pattern matches.
    fn concrete(path: &str) -> String {
        path.split('/')
            .map(|segment| {
                if segment.starts_with('{') {
                    "x"
                } else {
                    segment
                }
            })
            .collect::<Vec<_>>()
            .join("/")
    }

    async fn fetch(router: &Router, path: &str, host: &str) -> (StatusCode, String) {
        let request = Request::get(path)
            .header(header::HOST, host)
            .body(Body::empty())
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn every_route_but_the_probes_is_behind_the_host_guard() {
        let store = Store::connect("sqlite::memory:").await.unwrap();
        let mut parts = GatewayParts::new(
            ToolCatalog::new(Vec::new(), true),
            Governance::new(store, Default::default()),
        );
        // `/sse` from an allowed host is a stream read to its end here.
        parts.config.sse.idle_timeout = std::time::Duration::from_millis(50);
        let state = GatewayState::new(parts);
        let extra = Router::new().route("/metrics", get(|| async { "metrics" }));
        let router = router(state, Vec::new(), false, CancellationToken::new(), extra);
        let paths = served_paths(&router);
        // The list is the router's own: every surface is in it.
        for surface in [
            "/mcp",
            "/mcp/{*rest}",
            METADATA_PATH,
            "/admin/overview",
            "/admin/openapi.json",
            "/console",
            "/console/login",
            "/export",
            "/call",
            "/oauth/callback",
            "/oauth/sign-in",
            "/healthz",
            "/readyz",
            "/metrics",
            "/sse",
            "/messages",
        ] {
            assert!(paths.iter().any(|p| p == surface), "{surface} in {paths:?}");
        }
        // A path no route serves reaches the fallback, guarded too.
        let unrouted = "/no/such/route".to_string();
        for path in paths.iter().chain([&unrouted]) {
            let uri = concrete(path);
            let (status, body) = fetch(&router, &uri, "evil.example").await;
            if ["/healthz", "/readyz"].contains(&path.as_str()) {
                assert_ne!(status, StatusCode::FORBIDDEN, "{path}: {body}");
                continue;
            }
            assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
            assert!(body.contains("\"forbidden_host\""), "{path}: {body}");
            // From an allowed host the same request passes the guard.
            let (_, body) = fetch(&router, &uri, "localhost").await;
            assert!(!body.contains("forbidden_host"), "{path}: {body}");
        }
    }
}
