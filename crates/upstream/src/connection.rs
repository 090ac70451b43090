// Sampling, roots and logging are deprecated by SEP-2577; the gateway still
// relays them for the clients and servers that use them.
#![allow(deprecated)]

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex as StdMutex,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use rmcp::{
    ClientCacheConfig, ClientHandler, ClientLifecycleMode, ClientServiceExt, ErrorData, RoleClient,
    ServiceError,
    model::{
        CallToolRequest, CallToolRequestParams, CallToolResponse, CancelledNotificationParam,
        ClientCapabilities, ClientConfig, ClientRequest, ClientResult, CompleteRequest,
        CompleteRequestParams, CompleteResult, CreateMessageRequestParams, CreateMessageResult,
        ElicitRequestParams, ElicitResult, GetPromptRequest, GetPromptRequestParams,
        GetPromptResponse, Implementation, JsonObject, ListRootsResult, ProtocolVersion,
        ReadResourceRequest, ReadResourceRequestParams, ReadResourceResponse, RequestId,
        RequestMetaObject, ResourceUpdatedNotificationParam, ServerCapabilities,
        ServerNotification, ServerRequest, ServerResult, SubscribeRequestParams,
        SubscriptionFilter, UnsubscribeRequestParams,
    },
    service::{
        InboundStreamOrigin, NotificationContext, Peer, PeerRequestOptions, RequestContext,
        RunningService,
    },
    transport::{
        StreamableHttpClientTransport, TokioChildProcess,
        streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde::Serialize;
use tokio::sync::{Mutex, Semaphore, mpsc, oneshot};

use crate::{
    CallContext, Credentials, DEFAULT_INHERITED_ENV, PromptListing, Relay, ResourceListing,
    ResourceTemplateListing, ToolListing, UpstreamConfig, UpstreamError, expand_env,
    listing::{Page, list_all},
    plain_post::{ParamHeaderTools, PlainPost},
    principals::Principals,
    relay::{RelayInOrder, Routes},
};

/// The protocol era negotiated with an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Era {
    /// 2026-07-28: `server/discover`, stateless requests, `subscriptions/listen`.
    Modern,
    /// 2025-11-25 and older: `initialize` handshake.
    Legacy,
}

/// What the catalog needs to hear from an upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamEvent {
    /// The tool list changed (a `list_changed` notification, or a reconnect).
    ToolsChanged { server: String },
    /// The prompt list changed.
    PromptsChanged { server: String },
    /// The resource or resource-template list changed.
    ResourcesChanged { server: String },
    /// A subscribed resource changed (legacy `notifications/resources/updated`).
    ResourceUpdated { server: String, uri: String },
    /// The connection state changed.
    StateChanged { server: String },
}

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

#[derive(Debug, Clone, Serialize)]
pub struct LastError {
    pub at_ms: i64,
    pub operation: &'static str,
    pub message: String,
}

type Client = RunningService<RoleClient, UpstreamHandler>;

struct Live {
    client: Client,
    era: Era,
    protocol_version: String,
    pid: Option<u32>,
    /// Ends the supervisor watch for this particular connection.
    generation: u64,
    /// Set for a stateless HTTP upstream: plain calls skip rmcp's client.
    plain: Option<Arc<PlainPost>>,
}

/// What one request needs of the live connection.
struct Connected {
    peer: Peer<RoleClient>,
    era: Era,
    plain: Option<Arc<PlainPost>>,
}

/// State, era, protocol version and child pid of the current connection.
type StateCell = (UpstreamState, Option<Era>, Option<String>, Option<u32>);

/// One upstream MCP server. Cheap to share; every method is safe to call
/// concurrently.
pub struct Upstream {
    config: UpstreamConfig,
    live: Mutex<Option<Live>>,
    /// Readable without awaiting, for status snapshots.
    state: StdMutex<StateCell>,
    calls: Arc<Semaphore>,
    events: mpsc::UnboundedSender<UpstreamEvent>,
    restarts: AtomicU32,
    /// An `oauth` server with no usable tokens: someone has to sign in.
    needs_sign_in: AtomicBool,
    /// Set by `disable`; stops the supervisor from restarting.
    disabled: AtomicBool,
    generation: AtomicU32,
    /// What the live connection's server declared; readable without awaiting.
    capabilities: StdMutex<Option<ServerCapabilities>>,
    /// In-flight forwarded requests and where their progress, logs and
    /// server-to-client requests go.
    routes: Arc<Routes>,
    last_error: StdMutex<Option<LastError>>,
    param_header_tools: ParamHeaderTools,
    /// A caller's own connection of a per-principal server: whose token it
    /// carries.
    principal: Option<String>,
    /// A per-principal server: its callers' own connections.
    principals: Option<Principals>,
}

impl Upstream {
    pub fn new(config: UpstreamConfig, events: mpsc::UnboundedSender<UpstreamEvent>) -> Arc<Self> {
        Self::with_principal(config, events, None)
    }

    fn with_principal(
        config: UpstreamConfig,
        events: mpsc::UnboundedSender<UpstreamEvent>,
        principal: Option<String>,
    ) -> Arc<Self> {
        let principals = (principal.is_none() && config.credentials == Credentials::PerPrincipal)
            .then(Principals::default);
        Arc::new(Self {
            principal,
            principals,
            calls: Arc::new(Semaphore::new(config.max_concurrency)),
            config,
            live: Mutex::new(None),
            state: StdMutex::new((UpstreamState::NotConnected, None, None, None)),
            events,
            restarts: AtomicU32::new(0),
            needs_sign_in: AtomicBool::new(false),
            disabled: AtomicBool::new(false),
            generation: AtomicU32::new(0),
            capabilities: StdMutex::new(None),
            routes: Arc::default(),
            last_error: StdMutex::new(None),
            param_header_tools: ParamHeaderTools::default(),
        })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn config(&self) -> &UpstreamConfig {
        &self.config
    }

    pub fn status(&self) -> UpstreamStatus {
        let (state, era, protocol_version, pid) = self.state.lock().expect("state lock").clone();
        UpstreamStatus {
            name: self.config.name.clone(),
            description: self.config.description.clone(),
            transport: self.config.transport_kind(),
            state,
            era,
            protocol_version,
            restarts: self.restarts.load(Ordering::Relaxed),
            pid,
            last_error: self.last_error.lock().expect("last error lock").clone(),
            sign_in: self
                .needs_sign_in
                .load(Ordering::Relaxed)
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

    /// The connection `principal`'s requests go over on a per-principal
    /// server: its own, opened from the token the vault keeps for it. A
    /// principal with no token gets `auth_required` with a sign-in URL of
    /// its own.
    ///
    /// Only a request the broker has already allowed starts a sign-in
    /// (`start_sign_in`); a listing just says one is needed.
    async fn member(
        &self,
        principals: &Principals,
        principal: Option<&str>,
        start_sign_in: bool,
    ) -> Result<Arc<Upstream>, UpstreamError> {
        let server = &self.config.name;
        let Some(principal) = principal.filter(|p| !p.is_empty()) else {
            return Err(UpstreamError::AuthRequired {
                server: server.clone(),
                hint: "acts with each caller's own credentials, and this request names no caller"
                    .into(),
            });
        };
        if let Some(member) = principals.get(principal)
            && member.is_connected()
        {
            return Ok(member);
        }
        // Only a principal with a token takes one of the capped connections.
        let kept = match crate::oauth::vault() {
            Some(vault) => {
                vault
                    .load(server, principal)
                    .await
                    .map_err(|e| UpstreamError::Connect {
                        server: server.clone(),
                        reason: e,
                    })?
            }
            None => None,
        };
        // `None`: the principal must sign in (again).
        let failure = match kept {
            None => None,
            Some(_) => {
                let member = principals.get_or_insert(principal, &self.config, || {
                    let mut config = self.config.clone();
                    // A lost connection reopens on the caller's next request.
                    config.restart = false;
                    Self::with_principal(config, self.events.clone(), Some(principal.to_string()))
                });
                match member.connect_inner().await {
                    Ok(()) => return Ok(member),
                    Err(error) => {
                        principals.close(principal, &member);
                        (!member.needs_sign_in.load(Ordering::Relaxed)).then_some(error)
                    }
                }
            }
        };
        Err(match failure {
            Some(error) => error,
            None if start_sign_in => self.sign_in_needed(principals, principal).await,
            None => self.sign_in_pending(principals, principal),
        })
    }

    /// `auth_required` for a per-principal server `principal` has no token
    /// for, with the URL where it signs in. The caller must have been
    /// allowed this server: this registers with, and starts a sign-in at,
    /// the server's authorization server.
    pub async fn sign_in_required(&self, principal: &str) -> UpstreamError {
        match &self.principals {
            Some(principals) => self.sign_in_needed(principals, principal).await,
            None => UpstreamError::AuthRequired {
                server: self.config.name.clone(),
                hint: crate::oauth::sign_in_hint(&self.config.name),
            },
        }
    }

    /// `auth_required` without starting a sign-in: the URL `principal` was
    /// given, if any, else how to get one.
    fn sign_in_pending(&self, principals: &Principals, principal: &str) -> UpstreamError {
        let server = &self.config.name;
        let hint = match principals.sign_in_url(principal) {
            Some(url) => format!("needs {principal} to sign in: open {url}"),
            None => format!(
                "needs {principal} to sign in: call one of its tools, or enable_server {server}, for the sign-in URL"
            ),
        };
        UpstreamError::AuthRequired {
            server: server.clone(),
            hint,
        }
    }

    /// `auth_required`, with the URL where `principal` signs in (one per
    /// principal, handed out again for a few minutes).
    async fn sign_in_needed(&self, principals: &Principals, principal: &str) -> UpstreamError {
        let server = self.config.name.clone();
        let url = match principals.sign_in_url(principal) {
            Some(url) => url,
            None => {
                let Some(callback) = crate::oauth::callback_url() else {
                    return UpstreamError::AuthRequired {
                        server,
                        hint: format!(
                            "needs {principal} to sign in, and the gateway has no [gateway] public_url for the sign-in to return to"
                        ),
                    };
                };
                match crate::oauth::begin_sign_in(&self.config, principal, &callback).await {
                    Ok((_, url)) => {
                        principals.remember_sign_in(principal, &url);
                        url
                    }
                    Err(error) => {
                        return UpstreamError::AuthRequired {
                            server,
                            hint: format!(
                                "needs {principal} to sign in, and starting the sign-in failed: {error}"
                            ),
                        };
                    }
                }
            }
        };
        UpstreamError::AuthRequired {
            server,
            hint: format!("needs {principal} to sign in: open {url}"),
        }
    }

    /// A member's answer as the caller should see it: a refused token means
    /// that caller must sign in again.
    async fn member_answer<T>(
        &self,
        principals: &Principals,
        principal: Option<&str>,
        member: &Arc<Upstream>,
        result: Result<T, UpstreamError>,
        start_sign_in: bool,
    ) -> Result<T, UpstreamError> {
        match (result, principal) {
            (Err(UpstreamError::AuthRequired { .. }), Some(principal)) => {
                principals.close(principal, member);
                Err(if start_sign_in {
                    self.sign_in_needed(principals, principal).await
                } else {
                    self.sign_in_pending(principals, principal)
                })
            }
            (result, _) => result,
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

    fn set_state(&self, state: UpstreamState, live: Option<&Live>) {
        let up = matches!(state, UpstreamState::Connected);
        if self.principal.is_some() {
            // A caller's own connection: the server's state is the base's.
            self.state.lock().expect("state lock").0 = state;
            return;
        }
        metrics::gauge!("manifold_upstream_up", "server" => self.config.name.clone()).set(if up {
            1.0
        } else {
            0.0
        });
        {
            let mut guard = self.state.lock().expect("state lock");
            guard.0 = state;
            if let Some(live) = live {
                guard.1 = Some(live.era);
                guard.2 = Some(live.protocol_version.clone());
                guard.3 = live.pid;
            } else {
                guard.3 = None;
            }
        }
        let _ = self.events.send(UpstreamEvent::StateChanged {
            server: self.config.name.clone(),
        });
    }

    /// Connect if not connected. Idempotent; concurrent callers share one attempt.
    pub async fn connect(self: &Arc<Self>) -> Result<(), UpstreamError> {
        self.disabled.store(false, Ordering::SeqCst);
        self.connect_inner().await
    }

    async fn connect_inner(self: &Arc<Self>) -> Result<(), UpstreamError> {
        if self.principals.is_some() {
            // Nothing to open until a caller comes: each opens its own.
            if crate::oauth::vault().is_none() {
                return Err(UpstreamError::Connect {
                    server: self.config.name.clone(),
                    reason: "no OAuth vault in this process".into(),
                });
            }
            self.set_state(UpstreamState::Connected, None);
            return Ok(());
        }
        let mut live = self.live.lock().await;
        if let Some(existing) = live.as_ref() {
            if !existing.client.is_transport_closed() {
                return Ok(());
            }
            // The old connection died; drop it (this reaps a stdio child).
            *live = None;
        }
        self.set_state(UpstreamState::Connecting, None);
        let timeout = Duration::from_millis(self.config.connect_timeout_ms);
        let attempt = tokio::time::timeout(timeout, self.open()).await;
        let result = match attempt {
            Ok(Ok(new_live)) => {
                self.set_state(UpstreamState::Connected, Some(&new_live));
                let generation = new_live.generation;
                let peer = new_live.client.peer().clone();
                let era = new_live.era;
                *live = Some(new_live);
                self.spawn_watch(generation, peer, era);
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(UpstreamError::Timeout {
                server: self.config.name.clone(),
                operation: "connect",
                timeout_ms: self.config.connect_timeout_ms,
            }),
        };
        if let Err(e) = &result {
            self.set_state(UpstreamState::Failed(e.to_string()), None);
        }
        result
    }

    async fn open(&self) -> Result<Live, UpstreamError> {
        let name = &self.config.name;
        let connect_err = |reason: String| UpstreamError::Connect {
            server: name.clone(),
            reason,
        };
        let handler = UpstreamHandler {
            server: name.clone(),
            events: self.events.clone(),
            routes: Arc::clone(&self.routes),
        };
        let lifecycle = ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: None,
        };
        let generation = u64::from(self.generation.fetch_add(1, Ordering::SeqCst)) + 1;
        let mut plain_http = None;
        let (client, pid) = if let Some(url) = &self.config.url {
            let mut headers = HashMap::new();
            for (k, v) in &self.config.headers {
                let value = expand_env(v).map_err(connect_err)?;
                let key = http::HeaderName::try_from(k.as_str())
                    .map_err(|e| connect_err(format!("bad header name {k:?}: {e}")))?;
                let value = http::HeaderValue::try_from(value)
                    .map_err(|_| connect_err(format!("bad value for header {k:?}")))?;
                headers.insert(key, value);
            }
            let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .custom_headers(headers.clone());
            // Keep-alive: a call reuses an idle connection instead of paying
            // a TCP handshake. Idle ones close after 4 s, under the 5 s
            // keep-alive of common Python servers, so a reused connection is
            // rarely one the upstream is closing. Same-origin 307/308
            // redirects only, plus the trace context as a header.
            let mut builder = reqwest::Client::builder()
                .pool_idle_timeout(Duration::from_secs(4))
                .redirect(crate::trace::same_origin_redirects());
            if let (Some(addr), Some(host)) = (
                self.config.pinned_addr,
                reqwest::Url::parse(url)
                    .ok()
                    .and_then(|u| u.host_str().map(str::to_string)),
            ) {
                builder = builder.resolve(&host, addr);
            }
            let reqwest = builder.build().map_err(|e| connect_err(e.to_string()))?;
            let http = crate::trace::TracingHttpClient(reqwest.clone());
            let client = if self.config.auth == Some(crate::UpstreamAuth::Oauth) {
                // Every request carries the token and refreshes it when due;
                // the plain fast path would go without it.
                let principal = self.principal.as_deref().unwrap_or_default();
                let manager = crate::oauth::signed_in_manager(&self.config, principal).await;
                self.needs_sign_in.store(
                    manager
                        .as_ref()
                        .is_err_and(|e| *e == crate::oauth::sign_in_hint(&self.config.name)),
                    Ordering::Relaxed,
                );
                let manager = manager.map_err(connect_err)?;
                let http = rmcp::transport::auth::AuthClient::new(http, manager);
                let transport = StreamableHttpClientTransport::with_client(http, config);
                handler
                    .serve_with_lifecycle(RelayInOrder::new(transport, &self.routes), lifecycle)
                    .await
            } else {
                plain_http = Some((reqwest, url.clone(), headers, self.config.pinned_addr));
                let transport = StreamableHttpClientTransport::with_client(http, config);
                handler
                    .serve_with_lifecycle(RelayInOrder::new(transport, &self.routes), lifecycle)
                    .await
            }
            .map_err(|e| connect_err(e.to_string()))?;
            (client, None)
        } else {
            let command = self.config.command.as_deref().unwrap_or_default();
            let mut cmd = tokio::process::Command::new(command);
            for arg in &self.config.args {
                cmd.arg(expand_env(arg).map_err(connect_err)?);
            }
            // The gateway's environment holds its database URL and other
            // servers' secrets: a child gets only what the MCP SDKs pass by
            // default, what its entry names in `inherit_env`, and its `env`.
            cmd.env_clear();
            let inherited = DEFAULT_INHERITED_ENV
                .iter()
                .copied()
                .chain(self.config.inherit_env.iter().map(String::as_str));
            for name in inherited {
                if let Some(value) = std::env::var_os(name) {
                    cmd.env(name, value);
                }
            }
            for (k, v) in &self.config.env {
                cmd.env(k, expand_env(v).map_err(connect_err)?);
            }
            if let Some(cwd) = &self.config.cwd {
                cmd.current_dir(cwd);
            }
            let (transport, stderr) = TokioChildProcess::builder(cmd)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| connect_err(format!("cannot spawn {command:?}: {e}")))?;
            let pid = transport.id();
            if let Some(stderr) = stderr {
                spawn_stderr_logger(name.clone(), stderr);
            }
            let client = handler
                .serve_with_lifecycle(RelayInOrder::new(transport, &self.routes), lifecycle)
                .await
                .map_err(|e| connect_err(e.to_string()))?;
            (client, pid)
        };
        // The catalog owns caching (per caller, per scope, list_changed); a second
        // cache inside the client would answer for the wrong caller.
        client
            .peer()
            .set_response_cache_config(ClientCacheConfig::disabled())
            .await;
        let protocol_version = client
            .peer()
            .peer_info()
            .map(|info| info.protocol_version.to_string())
            .unwrap_or_default();
        *self.capabilities.lock().expect("capabilities lock") = client
            .peer()
            .peer_info()
            .map(|info| info.capabilities.clone());
        let era = era_of(&protocol_version);
        let plain = match (plain_http, client.peer().peer_info()) {
            (Some((http, url, headers, pinned)), Some(info)) if era == Era::Modern => {
                let ours = handler_info();
                PlainPost::new(
                    http,
                    &url,
                    pinned,
                    headers,
                    info.protocol_version.clone(),
                    ours.client_info,
                    ours.capabilities,
                )
                .map(Arc::new)
            }
            _ => None,
        };
        Ok(Live {
            client,
            era,
            protocol_version,
            pid,
            generation,
            plain,
        })
    }

    /// Watch one connection: on a modern upstream, hold a `subscriptions/listen`
    /// stream for list changes; on any upstream, notice when the transport dies
    /// and restart with backoff.
    fn spawn_watch(self: &Arc<Self>, generation: u64, peer: Peer<RoleClient>, era: Era) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            if era == Era::Modern {
                let listener = Arc::clone(&this);
                let listen_peer = peer.clone();
                tokio::spawn(async move { listener.listen_for_changes(listen_peer).await });
            }
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if this.current_generation().await != Some(generation) {
                    return; // replaced or disconnected on purpose
                }
                if peer.is_transport_closed() {
                    break;
                }
            }
            this.on_connection_lost(generation).await;
        });
    }

    async fn listen_for_changes(&self, peer: Peer<RoleClient>) {
        let filter = SubscriptionFilter::builder()
            .tools_list_changed()
            .prompts_list_changed()
            .resources_list_changed()
            .build();
        let Ok(mut subscription) = peer.listen(filter).await else {
            tracing::debug!(server = %self.config.name, "upstream refused subscriptions/listen");
            return;
        };
        let server = self.config.name.clone();
        while let Ok(Some(notification)) = subscription.next().await {
            let event = match notification {
                ServerNotification::ToolListChangedNotification(_) => UpstreamEvent::ToolsChanged {
                    server: server.clone(),
                },
                ServerNotification::PromptListChangedNotification(_) => {
                    UpstreamEvent::PromptsChanged {
                        server: server.clone(),
                    }
                }
                ServerNotification::ResourceListChangedNotification(_) => {
                    UpstreamEvent::ResourcesChanged {
                        server: server.clone(),
                    }
                }
                _ => continue,
            };
            let _ = self.events.send(event);
        }
    }

    async fn current_generation(&self) -> Option<u64> {
        self.live.lock().await.as_ref().map(|l| l.generation)
    }

    async fn on_connection_lost(self: &Arc<Self>, generation: u64) {
        {
            let mut live = self.live.lock().await;
            if live.as_ref().map(|l| l.generation) != Some(generation) {
                return;
            }
            // Dropping the client kills and reaps a stdio child: no zombies.
            if let Some(old) = live.take() {
                let _ = old.client.cancel().await;
            }
        }
        self.set_state(UpstreamState::Failed("connection lost".to_string()), None);
        tracing::warn!(server = %self.config.name, "upstream connection lost");
        if !self.config.restart {
            return;
        }
        let mut backoff = Duration::from_millis(200);
        loop {
            if self.disabled.load(Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep(backoff).await;
            if self.disabled.load(Ordering::SeqCst) {
                return;
            }
            self.restarts.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("manifold_upstream_restarts_total", "server" => self.config.name.clone())
                .increment(1);
            match self.connect_inner().await {
                Ok(()) => {
                    tracing::info!(server = %self.config.name, "upstream restarted");
                    let _ = self.events.send(UpstreamEvent::ToolsChanged {
                        server: self.config.name.clone(),
                    });
                    return;
                }
                Err(e) => {
                    tracing::warn!(server = %self.config.name, error = %e, "restart failed");
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
    }

    /// Close the connection on purpose; no restart follows.
    pub async fn disconnect(&self) {
        self.disabled.store(true, Ordering::SeqCst);
        if let Some(principals) = &self.principals {
            principals.close_all();
        }
        let old = self.live.lock().await.take();
        if let Some(old) = old {
            let _ = old.client.cancel().await;
        }
        self.set_state(UpstreamState::NotConnected, None);
    }

    /// Waits until no forwarded request holds a call permit (at most
    /// `timeout`), then disconnects. A server a reload removed or replaced
    /// finishes the calls it already has on its own connection.
    pub async fn retire(&self, timeout: Duration) {
        let permits = u32::try_from(self.config.max_concurrency).unwrap_or(u32::MAX);
        if tokio::time::timeout(timeout, self.calls.acquire_many(permits))
            .await
            .is_err()
        {
            tracing::warn!(server = %self.config.name, "calls still in flight at the drain deadline");
        }
        self.disconnect().await;
    }

    async fn peer(&self) -> Result<(Peer<RoleClient>, Era), UpstreamError> {
        self.connected().await.map(|c| (c.peer, c.era))
    }

    async fn connected(&self) -> Result<Connected, UpstreamError> {
        let live = self.live.lock().await;
        match live.as_ref() {
            Some(l) if !l.client.is_transport_closed() => Ok(Connected {
                peer: l.client.peer().clone(),
                era: l.era,
                plain: l.plain.clone(),
            }),
            _ => Err(UpstreamError::NotConnected {
                server: self.config.name.clone(),
            }),
        }
    }

    /// Page through one list method within `list_timeout_ms`.
    async fn list<P, F, Fut>(&self, fetch: F) -> Result<crate::Listing<P::Item>, UpstreamError>
    where
        P: Page,
        F: FnMut(Option<rmcp::model::PaginatedRequestParams>) -> Fut,
        Fut: Future<Output = Result<P, ServiceError>>,
    {
        let timeout = Duration::from_millis(self.config.list_timeout_ms);
        match tokio::time::timeout(
            timeout,
            list_all::<P, _, _>(&self.config.name, self.config.max_pages, fetch),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(UpstreamError::Timeout {
                server: self.config.name.clone(),
                operation: P::METHOD,
                timeout_ms: self.config.list_timeout_ms,
            }),
        }
    }

    /// The tools `principal` sees: on a per-principal server, listed over
    /// its own connection; elsewhere, [`Upstream::list_tools`].
    pub async fn list_tools_for(&self, principal: &str) -> Result<ToolListing, UpstreamError> {
        let Some(principals) = &self.principals else {
            return self.list_tools().await;
        };
        let member = self.member(principals, Some(principal), false).await?;
        let listed = member.list_tools().await;
        self.member_answer(principals, Some(principal), &member, listed, false)
            .await
    }

    /// All tools of this upstream, paged with guards, within `list_timeout_ms`.
    pub async fn list_tools(&self) -> Result<ToolListing, UpstreamError> {
        let (peer, _) = self.peer().await?;
        let listing: ToolListing = self.list(|params| peer.list_tools(params)).await?;
        self.param_header_tools.learn(&listing.items);
        Ok(listing)
    }

    /// All prompts, paged like tools.
    pub async fn list_prompts(&self) -> Result<PromptListing, UpstreamError> {
        let (peer, _) = self.peer().await?;
        self.list(|params| peer.list_prompts(params)).await
    }

    /// All resources, paged like tools.
    pub async fn list_resources(&self) -> Result<ResourceListing, UpstreamError> {
        let (peer, _) = self.peer().await?;
        self.list(|params| peer.list_resources(params)).await
    }

    /// All resource templates, paged like tools.
    pub async fn list_resource_templates(&self) -> Result<ResourceTemplateListing, UpstreamError> {
        let (peer, _) = self.peer().await?;
        self.list(|params| peer.list_resource_templates(params))
            .await
    }

    fn rpc_error(&self, operation: &'static str, error: ServiceError) -> UpstreamError {
        // rmcp's AuthClient reports a 401 it could not cure by refreshing as
        // a transport error whose text is all that reaches this far.
        if self.config.auth == Some(crate::UpstreamAuth::Oauth)
            && error.to_string().contains("Auth required")
        {
            self.needs_sign_in.store(true, Ordering::Relaxed);
            return UpstreamError::AuthRequired {
                server: self.config.name.clone(),
                hint: crate::oauth::sign_in_hint(&self.config.name),
            };
        }
        match error {
            ServiceError::McpError(error) => UpstreamError::Rpc {
                server: self.config.name.clone(),
                error,
            },
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => {
                UpstreamError::Protocol {
                    server: self.config.name.clone(),
                    message: format!("{operation} failed: the connection closed ({error})"),
                }
            }
            other => UpstreamError::Protocol {
                server: self.config.name.clone(),
                message: format!("{operation} failed: {other}"),
            },
        }
    }

    /// Send one request on behalf of a downstream caller, holding a
    /// concurrency permit, within `timeout_ms`. While it is in flight its
    /// progress, log messages and server-to-client requests go to the
    /// caller's relay. If this future is dropped (the caller cancelled, or the
    /// timeout fired), the upstream gets `notifications/cancelled`.
    async fn forward(
        &self,
        operation: &'static str,
        request: ClientRequest,
        context: &CallContext,
        timeout_ms: u64,
    ) -> Result<ServerResult, UpstreamError> {
        if let Some(principals) = &self.principals {
            // Boxed: its futures would make every call's future kilobytes
            // larger, and each call copies its future when boxing it.
            return Box::pin(
                self.forward_as_member(principals, operation, request, context, timeout_ms),
            )
            .await;
        }
        let started = Instant::now();
        let server = &self.config.name;
        // Names only: arguments never go into a span.
        let span = tracing::info_span!("upstream.request", server = %server, operation);
        let traceparent = crate::trace::traceparent(&span);
        // Pinned in place: the timeout holds a reference, not another copy.
        let work = std::pin::pin!(tracing::Instrument::instrument(
            async {
                let _permit = self.calls.acquire().await.expect("semaphore never closed");
                let Connected { peer, era, plain } = self.connected().await?;
                if let Some(plain) = plain
                    && let Some(name) = plain.takes(&request, context, &self.param_header_tools)
                {
                    // A dropped POST closes its stream: to a stateless upstream
                    // that is the cancellation.
                    let mut result = plain
                        .send(server, request, name, context, traceparent.as_deref())
                        .await?;
                    fill_missing_result_type(&mut result);
                    return Ok(result);
                }
                let mut meta = if era == Era::Modern {
                    context.modern_meta()
                } else {
                    RequestMetaObject::new()
                };
                if let Some(traceparent) = &traceparent {
                    meta.0.set_traceparent(traceparent.clone());
                }
                let mut options = PeerRequestOptions::no_options();
                if era == Era::Modern || traceparent.is_some() {
                    options = options.with_meta(meta);
                }
                let mut handle = peer
                    .send_request_with_option(request, options)
                    .await
                    .map_err(|e| self.rpc_error(operation, e))?;
                let _route =
                    self.routes
                        .register(handle.id.clone(), handle.progress_token.clone(), context);
                let mut cancel = CancelOnDrop {
                    peer: peer.clone(),
                    id: Some(handle.id.clone()),
                };
                let response = (&mut handle.rx).await;
                cancel.id = None;
                match response {
                    Ok(Ok(mut result)) => {
                        fill_missing_result_type(&mut result);
                        Ok(result)
                    }
                    Ok(Err(error)) => Err(self.rpc_error(operation, error)),
                    Err(_) => Err(self.rpc_error(operation, ServiceError::TransportClosed)),
                }
            },
            span
        ));
        let result = match tokio::time::timeout(Duration::from_millis(timeout_ms), work).await {
            Ok(r) => r,
            Err(_) => Err(UpstreamError::Timeout {
                server: server.clone(),
                operation,
                timeout_ms,
            }),
        };
        tracing::debug!(server = %server, operation, elapsed_ms = started.elapsed().as_millis() as u64, ok = result.is_ok(), "upstream request");
        if let Err(error) = &result {
            *self.last_error.lock().expect("last error lock") = Some(LastError {
                at_ms: now_ms(),
                operation,
                message: error.to_string(),
            });
        }
        result
    }

    /// [`Upstream::forward`] on a per-principal server: through the
    /// caller's own member connection.
    async fn forward_as_member(
        &self,
        principals: &Principals,
        operation: &'static str,
        request: ClientRequest,
        context: &CallContext,
        timeout_ms: u64,
    ) -> Result<ServerResult, UpstreamError> {
        let principal = context.principal.as_deref();
        let member = self.member(principals, principal, true).await?;
        let answer = Box::pin(member.forward(operation, request, context, timeout_ms)).await;
        self.member_answer(principals, principal, &member, answer, true)
            .await
    }

    fn result_too_large(&self, result: &rmcp::model::CallToolResult) -> Option<UpstreamError> {
        let limit = self.config.max_result_bytes;
        let bytes = crate::json_len(result);
        if bytes <= limit {
            return None;
        }
        let error = UpstreamError::ResultTooLarge {
            server: self.config.name.clone(),
            bytes,
            limit,
        };
        *self.last_error.lock().expect("last error lock") = Some(LastError {
            at_ms: now_ms(),
            operation: "tools/call",
            message: error.to_string(),
        });
        Some(error)
    }

    fn unexpected(&self, operation: &str, result: &ServerResult) -> UpstreamError {
        UpstreamError::Protocol {
            server: self.config.name.clone(),
            message: format!("{operation}: unexpected result {result:?}"),
        }
    }

    /// Forward one `tools/call`, holding a concurrency permit, within
    /// `call_timeout_ms`, with the caller's context: request `_meta`, relay,
    /// and the MRTR `inputResponses`/`requestState` of a retry.
    pub async fn call_tool_with(
        &self,
        tool: &str,
        arguments: Option<JsonObject>,
        context: &CallContext,
    ) -> Result<CallToolResponse, UpstreamError> {
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = arguments;
        params.input_responses = context.input_responses.clone();
        params.request_state = context.request_state.clone();
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let result = self
            .forward("tools/call", request, context, self.config.call_timeout_ms)
            .await?;
        match result {
            ServerResult::CallToolResult(r) => {
                if let Some(error) = self.result_too_large(&r) {
                    return Err(error);
                }
                Ok(CallToolResponse::Complete(r))
            }
            ServerResult::InputRequiredResult(r) => Ok(CallToolResponse::InputRequired(r)),
            ServerResult::CreateTaskResult(r) => Ok(CallToolResponse::Task(r)),
            other => Err(self.unexpected("tools/call", &other)),
        }
    }

    /// Forward one `prompts/get` (the MRTR fields of `params` pass through).
    pub async fn get_prompt(
        &self,
        params: GetPromptRequestParams,
        context: &CallContext,
    ) -> Result<GetPromptResponse, UpstreamError> {
        let request = ClientRequest::GetPromptRequest(GetPromptRequest::new(params));
        let timeout = self.config.call_timeout_ms;
        match self
            .forward("prompts/get", request, context, timeout)
            .await?
        {
            ServerResult::GetPromptResult(r) => Ok(GetPromptResponse::Complete(r)),
            ServerResult::InputRequiredResult(r) => Ok(GetPromptResponse::InputRequired(r)),
            other => Err(self.unexpected("prompts/get", &other)),
        }
    }

    /// Forward one `resources/read` (the MRTR fields of `params` pass through).
    pub async fn read_resource(
        &self,
        params: ReadResourceRequestParams,
        context: &CallContext,
    ) -> Result<ReadResourceResponse, UpstreamError> {
        let request = ClientRequest::ReadResourceRequest(ReadResourceRequest::new(params));
        let timeout = self.config.call_timeout_ms;
        match self
            .forward("resources/read", request, context, timeout)
            .await?
        {
            ServerResult::ReadResourceResult(r) => Ok(ReadResourceResponse::Complete(r)),
            ServerResult::InputRequiredResult(r) => Ok(ReadResourceResponse::InputRequired(r)),
            other => Err(self.unexpected("resources/read", &other)),
        }
    }

    /// Forward one `completion/complete`.
    pub async fn complete(
        &self,
        params: CompleteRequestParams,
        context: &CallContext,
    ) -> Result<CompleteResult, UpstreamError> {
        let request = ClientRequest::CompleteRequest(CompleteRequest::new(params));
        let timeout = self.config.list_timeout_ms;
        match self
            .forward("completion/complete", request, context, timeout)
            .await?
        {
            ServerResult::CompleteResult(r) => Ok(r),
            other => Err(self.unexpected("completion/complete", &other)),
        }
    }

    /// `resources/subscribe` on a legacy upstream that supports it; updates
    /// arrive as [`UpstreamEvent::ResourceUpdated`]. Returns whether the
    /// upstream took the subscription.
    pub async fn subscribe(&self, uri: &str) -> Result<bool, UpstreamError> {
        let (peer, era) = self.peer().await?;
        if era == Era::Modern || !self.supports_subscribe() {
            return Ok(false);
        }
        peer.subscribe(SubscribeRequestParams::new(uri))
            .await
            .map(|()| true)
            .map_err(|e| self.rpc_error("resources/subscribe", e))
    }

    /// `resources/unsubscribe`, the counterpart of [`Upstream::subscribe`].
    pub async fn unsubscribe(&self, uri: &str) -> Result<(), UpstreamError> {
        let (peer, era) = self.peer().await?;
        if era == Era::Modern || !self.supports_subscribe() {
            return Ok(());
        }
        peer.unsubscribe(UnsubscribeRequestParams::new(uri))
            .await
            .map_err(|e| self.rpc_error("resources/unsubscribe", e))
    }

    fn supports_subscribe(&self) -> bool {
        self.capabilities()
            .and_then(|caps| caps.resources)
            .and_then(|resources| resources.subscribe)
            .unwrap_or(false)
    }
}

/// Sends `notifications/cancelled` for a request that is dropped before its
/// response arrived.
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        let peer = self.peer.clone();
        let params = CancelledNotificationParam::new(
            Some(id),
            Some("cancelled by the downstream caller".to_string()),
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = peer.notify_cancelled(params).await;
            });
        }
    }
}

fn spawn_stderr_logger(server: String, stderr: tokio::process::ChildStderr) {
    use tokio::io::AsyncBufReadExt;
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::debug!(server = %server, "upstream stderr: {line}");
        }
    });
}

/// Receives upstream notifications for the catalog, and relays what belongs
/// to an in-flight request (progress, logs, server-to-client requests) to the
/// downstream caller that made it.
#[derive(Clone)]
pub(crate) struct UpstreamHandler {
    server: String,
    events: mpsc::UnboundedSender<UpstreamEvent>,
    routes: Arc<Routes>,
}

impl UpstreamHandler {
    /// Hand a server-to-client request to the caller of the request it
    /// belongs to, and wait for the caller's answer.
    async fn relay_request(
        &self,
        request: ServerRequest,
        context: &RequestContext<RoleClient>,
    ) -> Result<ClientResult, ErrorData> {
        let associated = match context.extensions.get::<InboundStreamOrigin>() {
            Some(InboundStreamOrigin::OutboundRequest(id)) => Some(id.clone()),
            _ => None,
        };
        let Some(relay) = self.routes.for_request(associated.as_ref()) else {
            return Err(ErrorData::invalid_request(
                "no downstream request is in flight to answer this request",
                None,
            ));
        };
        let (reply, answer) = oneshot::channel();
        relay
            .send(Relay::Request { request, reply })
            .map_err(|_| ErrorData::internal_error("the downstream caller went away", None))?;
        tokio::select! {
            answer = answer => answer
                .unwrap_or_else(|_| Err(ErrorData::internal_error("the downstream caller went away", None))),
            () = context.ct.cancelled() => Err(ErrorData::internal_error("cancelled by the upstream", None)),
        }
    }

    fn event(&self, event: UpstreamEvent) {
        let _ = self.events.send(event);
    }
}

impl ClientHandler for UpstreamHandler {
    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let request =
            ServerRequest::CreateMessageRequest(rmcp::model::CreateMessageRequest::new(params));
        match self.relay_request(request, &context).await? {
            ClientResult::CreateMessageResult(result) => Ok(*result),
            other => Err(unexpected_answer(&other)),
        }
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let request = ServerRequest::ElicitRequest(rmcp::model::ElicitRequest::new(params));
        match self.relay_request(request, &context).await? {
            ClientResult::ElicitResult(result) => Ok(result),
            other => Err(unexpected_answer(&other)),
        }
    }

    async fn list_roots(
        &self,
        context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        let request = ServerRequest::ListRootsRequest(rmcp::model::ListRootsRequest::default());
        match self.relay_request(request, &context).await? {
            ClientResult::ListRootsResult(result) => Ok(result),
            other => Err(unexpected_answer(&other)),
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.event(UpstreamEvent::ToolsChanged {
            server: self.server.clone(),
        });
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.event(UpstreamEvent::PromptsChanged {
            server: self.server.clone(),
        });
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.event(UpstreamEvent::ResourcesChanged {
            server: self.server.clone(),
        });
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.event(UpstreamEvent::ResourceUpdated {
            server: self.server.clone(),
            uri: params.uri,
        });
    }

    fn get_info(&self) -> ClientConfig {
        handler_info()
    }
}

/// Who the gateway says it is to upstreams.
fn handler_info() -> ClientConfig {
    // Everything a downstream client might answer is relayed; per request,
    // 2026-07-28 upstreams see the real client's capabilities instead.
    let capabilities: ClientCapabilities = serde_json::from_value(serde_json::json!({
        "sampling": {}, "elicitation": {}, "roots": {}
    }))
    .expect("client capabilities literal is valid");
    ClientConfig::new(
        capabilities,
        Implementation::new("manifold", env!("CARGO_PKG_VERSION")),
    )
}

fn unexpected_answer(result: &ClientResult) -> ErrorData {
    ErrorData::internal_error(
        format!("the downstream client answered with an unexpected result: {result:?}"),
        None,
    )
}

/// A 2025-era upstream sends no `resultType`; 2026-07-28 clients require it
/// (absent means "complete"). rmcp strips it again for legacy downstream peers.
fn fill_missing_result_type(result: &mut ServerResult) {
    let result_type = match result {
        ServerResult::CallToolResult(r) => &mut r.result_type,
        ServerResult::GetPromptResult(r) => &mut r.result_type,
        ServerResult::ReadResourceResult(r) => &mut r.result_type,
        ServerResult::CompleteResult(r) => &mut r.result_type,
        ServerResult::ListToolsResult(r) => &mut r.result_type,
        ServerResult::ListPromptsResult(r) => &mut r.result_type,
        ServerResult::ListResourcesResult(r) => &mut r.result_type,
        ServerResult::ListResourceTemplatesResult(r) => &mut r.result_type,
        _ => return,
    };
    result_type.get_or_insert(rmcp::model::ResultType::COMPLETE);
}

/// The era a negotiated protocol version belongs to. Versions are ISO dates,
/// so they compare as strings; anything unrecognisable is legacy.
pub fn era_of(protocol_version: &str) -> Era {
    let is_date = protocol_version.len() == 10
        && protocol_version.bytes().enumerate().all(|(i, b)| {
            if i == 4 || i == 7 {
                b == b'-'
            } else {
                b.is_ascii_digit()
            }
        });
    if is_date && protocol_version >= "2026-07-28" {
        Era::Modern
    } else {
        Era::Legacy
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
