//! Streamable HTTP at `/mcp`, stateless for 2026-07-28 clients and
//! session-free for 2025-11-25 ones.

use std::sync::Arc;

use axum::Router;
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use tokio_util::sync::CancellationToken;

use crate::{Gateway, GatewayState};

/// The gateway's HTTP routes. `allowed_hosts` guards against DNS rebinding;
/// loopback names are always allowed.
pub fn router(
    state: Arc<GatewayState>,
    allowed_hosts: Vec<String>,
    shutdown: CancellationToken,
) -> Router {
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    hosts.extend(allowed_hosts);
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_allowed_hosts(hosts)
        .with_cancellation_token(shutdown);
    let service = StreamableHttpService::new(
        move || Ok(Gateway::new(Arc::clone(&state))),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    Router::new().nest_service("/mcp", service)
}
