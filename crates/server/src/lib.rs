//! The gateway's downstream surfaces: MCP over Streamable HTTP and stdio,
//! the admin API, the console, and the provider API.
//!
//! [`Gateway`] is an rmcp `ServerHandler`. In direct mode it is a complete MCP
//! server: the catalog's tools under their qualified names, and the upstreams'
//! prompts (qualified too), resources and resource templates, completions and
//! logging, with progress, log messages and client input relayed between the
//! caller and the upstream; in progressive mode it exposes a fixed set of
//! meta-tools (`search_tools`, `get_tool_details`, `call_tool`,
//! `search_available_servers`, `enable_server`, `disable_server`, and
//! `execute_code` when code mode is on) whose array never changes, so the
//! client's prompt cache holds. Every request that reaches an upstream is
//! decided by the broker first (`mcp/request_kinds.rs`, a test, maps every
//! kind of client request to how it is decided). [`http::router`] serves it
//! over Streamable HTTP; [`serve_stdio`] over stdio.
//!
//! Modules, by surface:
//! - `http`: the server loop, the router (every route behind the Host
//!   guard), and `/mcp`'s pipeline: guard, auth, requests, admission, the
//!   fast call; the probes.
//! - `mcp`: the MCP server: handler, forwarding, the tool call,
//!   meta-tools, discovery, list changes, calls in flight, mode, code mode.
//! - `admin`: the admin API, over `admin::ops`; `console`: the operator's
//!   pages, over the same operations.
//! - `provider`: provider-native export and search, the provider API, and
//!   the callback of upstream OAuth sign-ins.
//! - `replicas`: what gateway processes sharing a store tell each other.
//!
//! [`GatewayState`] is built once, from [`GatewayParts`], and shared by
//! every surface.

pub mod admin;
mod console;
pub mod http;
mod mcp;
pub mod provider;
pub mod replicas;

/// Request-header parsing, exposed for the fuzz targets in `fuzz/`.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::http::{auth::bearer, guard::origin_allowed};
}

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use manifold_broker::{Broker, Caller, Governance, Refusal, Visible};
use manifold_catalog::ToolCatalog;
use manifold_search::Strategy;
use manifold_upstream::{UpstreamEvent, oauth::OAuthClient};
use tokio::sync::mpsc::UnboundedSender;

pub use http::{
    admission::{Admission, AdmissionConfig, BUSY_CODE},
    auth::{AuthConfig, ConsoleSessions, OidcCallers},
    principal::principal_from_token,
    requests::Requests,
};
pub use mcp::{
    Gateway,
    changes::{Change, ChangeHub},
    discovery::{Detail, Discovery, SearchOutcome},
    meta::{meta_tools, meta_tools_for},
    mode::{Mode, ModeDecision, decide_mode},
};

/// Settings of the downstream surface.
#[derive(Debug, Clone)]
pub struct SurfaceConfig {
    pub mode: Mode,
    pub strategy: Strategy,
    pub default_limit: usize,
    pub max_limit: usize,
    pub admission: AdmissionConfig,
    /// Hot tools and search kind of the provider exports.
    pub export: manifold_export::ExportConfig,
    /// Larger request bodies are refused with 413 before any handler reads them.
    pub max_body_bytes: usize,
    /// What `POST /admin/servers` may add while the gateway runs.
    pub runtime_servers: admin::ops::RuntimeServers,
    /// Answer plain direct-mode `tools/call` requests without rmcp's
    /// per-request machinery (`http/fast_call.rs`).
    pub fast_calls: bool,
    /// Bounds on legacy HTTP+SSE sessions (`/sse`).
    pub sse: http::sse::SseLimits,
}

impl Default for SurfaceConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Progressive,
            strategy: Strategy::Bm25,
            default_limit: 8,
            max_limit: 50,
            admission: AdmissionConfig::default(),
            export: manifold_export::ExportConfig::default(),
            max_body_bytes: 4 * 1024 * 1024,
            runtime_servers: Default::default(),
            fast_calls: true,
            sse: http::sse::SseLimits::default(),
        }
    }
}

/// What a [`GatewayState`] is made of. The binary's wiring makes each part
/// first, then the state, once.
pub struct GatewayParts {
    pub catalog: Arc<ToolCatalog>,
    /// Decides every request that reaches an upstream; code mode's scripts
    /// call through the same broker.
    pub broker: Arc<Broker>,
    /// Search indexes, with the embedding and rerank models if loaded.
    pub discovery: Discovery,
    pub config: SurfaceConfig,
    pub auth: AuthConfig,
    /// Set when code mode is on.
    pub code_mode: Option<Arc<manifold_codemode::CodeMode>>,
    /// Where a server added at run time (admin API) sends its events; none
    /// where the gateway adds no servers.
    pub upstream_events: Option<UnboundedSender<UpstreamEvent>>,
    /// The upstreams' OAuth client: the admin API's sign-ins use it, and a
    /// server added at run time gets it.
    pub oauth: OAuthClient,
    /// The config file that server forms write, when the gateway serves one.
    pub server_file: Option<Arc<dyn admin::ServerFile>>,
}

impl GatewayParts {
    /// The parts of a gateway over `catalog` and `governance`, with default
    /// settings and none of the optional parts.
    pub fn new(catalog: Arc<ToolCatalog>, governance: Arc<Governance>) -> Self {
        GatewayParts {
            broker: Broker::new(Arc::clone(&catalog), governance),
            catalog,
            discovery: Discovery::default(),
            config: SurfaceConfig::default(),
            auth: AuthConfig::default(),
            code_mode: None,
            upstream_events: None,
            oauth: OAuthClient::default(),
            server_file: None,
        }
    }
}

/// Everything a request handler needs, shared by all connections.
pub struct GatewayState {
    pub catalog: Arc<ToolCatalog>,
    /// Every request that reaches an upstream for a caller is decided here.
    pub broker: Arc<Broker>,
    pub discovery: Discovery,
    pub config: SurfaceConfig,
    /// Tells downstream clients about list changes.
    pub changes: Arc<ChangeHub>,
    pub auth: AuthConfig,
    /// Bounds concurrent discovery over HTTP.
    pub admission: Arc<Admission>,
    /// Tool calls in flight, by caller and request id, so that an explicit
    /// `notifications/cancelled` (which may arrive on another HTTP request)
    /// reaches the broker's upstream call.
    pub(crate) in_flight: mcp::in_flight::InFlight,
    /// JSON-RPC requests over HTTP being answered now; a shutdown drains them.
    pub requests: Arc<Requests>,
    /// Set once the catalog has finished its first load.
    ready: AtomicBool,
    code_mode: Option<Arc<manifold_codemode::CodeMode>>,
    upstream_events: Option<UnboundedSender<UpstreamEvent>>,
    oauth: OAuthClient,
    server_file: Option<Arc<dyn admin::ServerFile>>,
}

impl GatewayState {
    pub fn new(parts: GatewayParts) -> Arc<Self> {
        let GatewayParts {
            catalog,
            broker,
            discovery,
            config,
            auth,
            code_mode,
            upstream_events,
            oauth,
            server_file,
        } = parts;
        Arc::new(Self {
            admission: Arc::new(Admission::new(config.admission)),
            catalog,
            broker,
            discovery,
            config,
            changes: Arc::default(),
            auth,
            in_flight: Default::default(),
            requests: Arc::default(),
            ready: AtomicBool::new(false),
            code_mode,
            upstream_events,
            oauth,
            server_file,
        })
    }

    /// Marks the first catalog load done; `/readyz` waits for it.
    pub fn mark_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    pub fn code_mode(&self) -> Option<&Arc<manifold_codemode::CodeMode>> {
        self.code_mode.as_ref()
    }

    pub(crate) fn upstream_events(&self) -> Option<&UnboundedSender<UpstreamEvent>> {
        self.upstream_events.as_ref()
    }

    pub(crate) fn oauth(&self) -> &OAuthClient {
        &self.oauth
    }

    pub(crate) fn server_file(&self) -> Option<&Arc<dyn admin::ServerFile>> {
        self.server_file.as_ref()
    }

    pub fn governance(&self) -> &Arc<Governance> {
        self.broker.governance()
    }

    /// What `caller` may see of the catalog now. `audit`: the kind of
    /// discovery row to record for the whole visible set, if any.
    /// A refusal is recorded in the activity audit.
    pub async fn visible(&self, caller: &Caller, audit: Option<&str>) -> Result<Visible, Refusal> {
        let view = self.catalog.view(&caller.principal).await;
        let visible = self.governance().visible(caller, &view, audit).await;
        if let Err(refusal) = &visible {
            let kind = match audit {
                Some("list") => "tools/list",
                Some(kind) => kind,
                None => "discovery",
            };
            self.governance()
                .record_refusal(caller, kind, "*", &Default::default(), refusal)
                .await;
        }
        visible
    }

    /// Pass an upstream event on to downstream clients. Direct mode only: the
    /// progressive tools array never changes.
    pub async fn announce(&self, event: &UpstreamEvent) {
        if self.config.mode != Mode::Direct {
            return;
        }
        if let Some(change) = Change::from_event(event) {
            self.changes.announce(change).await;
        }
    }
}

/// Serve one MCP session over stdin/stdout until the client closes it.
pub async fn serve_stdio(state: Arc<GatewayState>, caller: Caller) -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let running = Gateway::with_fixed_caller(state, caller)
        .serve(rmcp::transport::stdio())
        .await?;
    running.waiting().await?;
    Ok(())
}
