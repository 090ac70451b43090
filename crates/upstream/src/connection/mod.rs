//! One upstream MCP server, [`Upstream`], by job:
//!
//! - [`open`]: opening a connection (the transport, the era, the plain POST);
//! - [`supervise`]: watching the server's connection, restarting it with
//!   backoff, and the state that status snapshots show;
//! - [`forward`]: requests on behalf of downstream callers, and listings;
//! - [`principals`]: a per-principal server's connections, one per caller,
//!   and their sign-ins;
//! - [`handler`]: rmcp's client handler, for what the upstream says unasked;
//! - [`openapi`]: an OpenAPI server, whose calls are HTTP requests.

mod forward;
mod handler;
mod open;
mod openapi;
mod principals;
mod supervise;
mod tasks;

use std::sync::{
    Arc, Mutex as StdMutex,
    atomic::{AtomicBool, AtomicU32, Ordering},
};

use rmcp::model::ServerCapabilities;
use serde::Serialize;
use tokio::sync::mpsc;

use open::Connection;
pub use open::{Era, LastError, era_of};
use principals::Principals;

use crate::{Credentials, UpstreamConfig, UpstreamError, UpstreamEvent, oauth::OAuthClient};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "reason")]
pub enum UpstreamState {
    NotConnected,
    Connecting,
    Connected,
    Failed(String),
}

/// A snapshot for `search_available_servers`, `catalog stats` and the console.
#[derive(Debug, Clone, Serialize)]
pub struct UpstreamStatus {
    pub name: String,
    pub description: String,
    /// `stdio`, `openapi`, or an HTTP server's `streamable_http` or `sse`
    /// (`auto` until its first connection decides).
    pub transport: &'static str,
    #[serde(flatten)]
    pub state: UpstreamState,
    pub era: Option<Era>,
    pub protocol_version: Option<String>,
    pub restarts: u32,
    pub pid: Option<u32>,
    /// The newest failed request (a timeout, a dropped connection, an
    /// unreadable reply), so that a server that hangs or lies while
    /// "connected" still shows what went wrong.
    pub last_error: Option<LastError>,
    /// How to sign in, for an `oauth` server that needs it.
    pub sign_in: Option<String>,
    /// A per-principal server: how many callers' own connections are open.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal_connections: Option<usize>,
}

/// State, era, protocol version, child pid and HTTP transport of the
/// current (or last) connection.
type StateCell = (
    UpstreamState,
    Option<Era>,
    Option<String>,
    Option<u32>,
    Option<crate::HttpTransport>,
);

/// One upstream MCP server. Cheap to share; every method is safe to call
/// concurrently.
pub struct Upstream {
    config: Arc<UpstreamConfig>,
    /// The server's own connection; a per-principal server's requests go
    /// over its callers' connections instead.
    connection: Connection,
    /// Readable without awaiting, for status snapshots.
    state: StdMutex<StateCell>,
    events: mpsc::UnboundedSender<UpstreamEvent>,
    /// The vault of an `oauth` server's tokens, and where sign-ins return.
    oauth: OAuthClient,
    restarts: AtomicU32,
    /// Set by `disable`; stops the supervisor from restarting.
    disabled: AtomicBool,
    /// What the live connection's server declared; readable without awaiting.
    capabilities: StdMutex<Option<ServerCapabilities>>,
    /// A per-principal server: its callers' own connections.
    principals: Option<Principals>,
    /// An OpenAPI server: its document and tools, in place of a session.
    openapi: Option<openapi::OpenApi>,
}

impl Upstream {
    pub fn new(
        config: UpstreamConfig,
        events: mpsc::UnboundedSender<UpstreamEvent>,
        oauth: OAuthClient,
    ) -> Arc<Self> {
        let config = Arc::new(config);
        let principals = (config.credentials == Credentials::PerPrincipal)
            .then(|| Principals::new(&config, &events, &oauth));
        let openapi = config.openapi.is_some().then(openapi::OpenApi::default);
        Arc::new(Self {
            principals,
            openapi,
            connection: Connection::new(&config),
            config,
            state: StdMutex::new((UpstreamState::NotConnected, None, None, None, None)),
            events,
            oauth,
            restarts: AtomicU32::new(0),
            disabled: AtomicBool::new(false),
            capabilities: StdMutex::new(None),
        })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn config(&self) -> &UpstreamConfig {
        &self.config
    }

    pub fn status(&self) -> UpstreamStatus {
        let (state, era, protocol_version, pid, used) =
            self.state.lock().expect("state lock").clone();
        UpstreamStatus {
            name: self.config.name.clone(),
            description: self.config.description.clone(),
            // What the last connection used; before one, what is configured.
            transport: used.map_or_else(|| self.config.transport_kind(), |t| t.as_str()),
            state,
            era,
            protocol_version,
            restarts: self.restarts.load(Ordering::Relaxed),
            pid,
            last_error: self.connection.last_error(),
            sign_in: self
                .connection
                .needs_sign_in()
                .then(|| crate::oauth::sign_in_hint(&self.config.name)),
            principal_connections: self.principals.as_ref().map(Principals::count),
        }
    }

    /// Whether each caller's requests go over a connection of its own, with
    /// its own token (`credentials = "per_principal"`).
    pub fn per_principal(&self) -> bool {
        self.principals.is_some()
    }

    /// The sign-in URL `principal` was given recently for this
    /// per-principal server, if it has not signed in since.
    pub fn sign_in_for(&self, principal: &str) -> Option<String> {
        self.principals.as_ref()?.sign_in_url(principal)
    }

    /// `principal` has just signed in: its next request opens a connection
    /// with the new token.
    pub fn signed_in(&self, principal: &str) {
        if let Some(principals) = &self.principals {
            principals.forget_sign_in(principal);
            principals.close_principal(principal);
        }
    }

    /// `auth_required` for a per-principal server `principal` has no token
    /// for, with the URL where it signs in. The caller must have been
    /// allowed this server: this registers with, and starts a sign-in at,
    /// the server's authorization server.
    pub async fn sign_in_required(&self, principal: &str) -> UpstreamError {
        match &self.principals {
            Some(principals) => principals.sign_in_needed(principal).await,
            None => UpstreamError::AuthRequired {
                server: self.config.name.clone(),
                hint: crate::oauth::sign_in_hint(&self.config.name),
            },
        }
    }

    pub fn is_connected(&self) -> bool {
        matches!(
            self.state.lock().expect("state lock").0,
            UpstreamState::Connected
        )
    }

    /// The capabilities the server declared on its current (or last)
    /// connection; `None` before the first connection.
    pub fn capabilities(&self) -> Option<ServerCapabilities> {
        self.capabilities.lock().expect("capabilities lock").clone()
    }

    /// The era of the current (or last) connection.
    pub fn era(&self) -> Option<Era> {
        self.state.lock().expect("state lock").1
    }
}
