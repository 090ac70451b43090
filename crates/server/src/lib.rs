//! The downstream MCP surface: what a model's client talks to.
//!
//! [`Gateway`] is an rmcp `ServerHandler`. In direct mode it is a complete MCP
//! server: the catalog's tools under their qualified names, and the upstreams'
//! prompts (qualified too), resources and resource templates, completions and
//! logging, with progress, log messages and client input relayed between the
//! caller and the upstream ([`forward`]); in progressive mode it exposes
//! a fixed set of meta-tools (`search_tools`, `get_tool_details`, `call_tool`,
//! `search_available_servers`, `enable_server`, `disable_server`, and
//! `execute_code` when code mode is on) whose array never changes, so the
//! client's prompt cache holds. Every request that reaches an upstream is
//! decided by the broker first (`door.rs`, a test, maps every kind of
//! client request to how it is decided). [`http::router`] serves it over Streamable HTTP; [`serve_stdio`]
//! over stdio.

pub mod admin;
mod admission;
mod auth;
mod changes;
mod code;
mod console;
mod discovery;
#[cfg(test)]
mod door;
pub mod export;
mod fast_call;
mod forward;
mod guard;

/// Request-header parsing, exposed for the fuzz targets in `fuzz/`.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::auth::bearer;
    pub use crate::guard::origin_allowed;
}
mod handler;
pub mod health;
pub mod http;
mod in_flight;
pub mod listen;
mod meta;
mod mode;
mod oauth_callback;
mod pipeline;
mod principal;
mod provider_api;
pub mod replicas;
mod requests;

use std::sync::Arc;

use manifold_broker::{Broker, Caller, Governance, Refusal, Visible};
use manifold_catalog::ToolCatalog;
use manifold_search::Strategy;

pub use admission::{Admission, AdmissionConfig, BUSY_CODE};
pub use auth::{ConsoleSessions, OidcCallers};
pub use changes::{Change, ChangeHub};
pub use discovery::{Detail, Discovery, SearchOutcome};
pub use handler::Gateway;
pub use meta::{meta_tools, meta_tools_for};
pub use mode::{Mode, ModeDecision, decide_mode};
pub use principal::{AuthConfig, principal_from_token};
pub use requests::Requests;

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
    /// per-request machinery (`fast_call.rs`).
    pub fast_calls: bool,
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
    pub(crate) in_flight: in_flight::InFlight,
    /// JSON-RPC requests over HTTP being answered now; a shutdown drains them.
    pub requests: Arc<Requests>,
    /// Set once the catalog has finished its first load.
    ready: std::sync::atomic::AtomicBool,
    /// Set once at start when code mode is on.
    code_mode: std::sync::OnceLock<Arc<manifold_codemode::CodeMode>>,
    /// Where a server added at run time (admin API) sends its events.
    upstream_events:
        std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<manifold_upstream::UpstreamEvent>>,
    /// The config file that server forms write, when the gateway serves one.
    server_file: std::sync::OnceLock<Arc<dyn admin::ServerFile>>,
}

impl GatewayState {
    pub fn new(
        catalog: Arc<ToolCatalog>,
        config: SurfaceConfig,
        governance: Arc<Governance>,
        auth: AuthConfig,
    ) -> Arc<Self> {
        let admission = Arc::new(Admission::new(config.admission));
        Arc::new(Self {
            broker: Broker::new(Arc::clone(&catalog), governance),
            discovery: Discovery::default(),
            catalog,
            config,
            changes: Arc::default(),
            admission,
            in_flight: Default::default(),
            requests: Arc::default(),
            ready: Default::default(),
            auth,
            code_mode: std::sync::OnceLock::new(),
            upstream_events: std::sync::OnceLock::new(),
            server_file: std::sync::OnceLock::new(),
        })
    }

    /// Marks the first catalog load done; `/readyz` waits for it.
    pub fn mark_ready(&self) {
        self.ready.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Turns code mode on (once; later calls are ignored).
    pub fn enable_code_mode(&self, code_mode: Arc<manifold_codemode::CodeMode>) {
        let _ = self.code_mode.set(code_mode);
    }

    pub fn code_mode(&self) -> Option<&Arc<manifold_codemode::CodeMode>> {
        self.code_mode.get()
    }

    /// Lets the admin API add servers at run time, on the catalog's event
    /// channel (once; later calls are ignored).
    pub fn set_upstream_events(
        &self,
        events: tokio::sync::mpsc::UnboundedSender<manifold_upstream::UpstreamEvent>,
    ) {
        let _ = self.upstream_events.set(events);
    }

    pub(crate) fn upstream_events(
        &self,
    ) -> Option<&tokio::sync::mpsc::UnboundedSender<manifold_upstream::UpstreamEvent>> {
        self.upstream_events.get()
    }

    /// Lets the admin API and the console keep servers in the config file
    /// (once; later calls are ignored).
    pub fn set_server_file(&self, file: Arc<dyn admin::ServerFile>) {
        let _ = self.server_file.set(file);
    }

    pub(crate) fn server_file(&self) -> Option<&Arc<dyn admin::ServerFile>> {
        self.server_file.get()
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
    pub async fn announce(&self, event: &manifold_upstream::UpstreamEvent) {
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
