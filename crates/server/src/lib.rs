//! The downstream MCP surface: what a model's client talks to.
//!
//! [`Gateway`] is an rmcp `ServerHandler`. In direct mode it exposes the
//! catalog's tools under their qualified names; in progressive mode it exposes
//! a fixed set of meta-tools (`search_tools`, `get_tool_details`, `call_tool`,
//! `search_available_servers`, `enable_server`, `disable_server`) whose array
//! never changes, so the client's prompt cache holds. Every tool call goes to
//! the broker. [`http::router`] serves it over Streamable HTTP; [`serve_stdio`]
//! over stdio.

mod discovery;
mod handler;
pub mod http;
mod meta;
mod mode;
mod principal;

use std::sync::Arc;

use manifold_broker::Broker;
use manifold_catalog::ToolCatalog;
use manifold_search::Strategy;

pub use discovery::{Detail, Discovery, SearchOutcome};
pub use handler::Gateway;
pub use meta::meta_tools;
pub use mode::{Mode, ModeDecision, decide_mode};
pub use principal::principal_from_token;

/// Settings of the downstream surface.
#[derive(Debug, Clone)]
pub struct SurfaceConfig {
    pub mode: Mode,
    pub strategy: Strategy,
    pub default_limit: usize,
    pub max_limit: usize,
}

impl Default for SurfaceConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Progressive,
            strategy: Strategy::Bm25,
            default_limit: 8,
            max_limit: 50,
        }
    }
}

/// Everything a request handler needs, shared by all connections.
pub struct GatewayState {
    pub catalog: Arc<ToolCatalog>,
    pub broker: Arc<Broker>,
    pub discovery: Discovery,
    pub config: SurfaceConfig,
}

impl GatewayState {
    pub fn new(catalog: Arc<ToolCatalog>, config: SurfaceConfig) -> Arc<Self> {
        Arc::new(Self {
            broker: Broker::new(Arc::clone(&catalog)),
            discovery: Discovery::default(),
            catalog,
            config,
        })
    }
}

/// Serve one MCP session over stdin/stdout until the client closes it.
pub async fn serve_stdio(
    state: Arc<GatewayState>,
    principal: manifold_catalog::Principal,
) -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let running = Gateway::with_fixed_principal(state, principal)
        .serve(rmcp::transport::stdio())
        .await?;
    running.waiting().await?;
    Ok(())
}
