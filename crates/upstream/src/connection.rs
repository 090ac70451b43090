use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex as StdMutex,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use rmcp::{
    ClientCacheConfig, ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient,
    model::{
        CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, Implementation,
        JsonObject, ProtocolVersion, SubscriptionFilter,
    },
    service::{NotificationContext, Peer, RunningService},
    transport::{
        StreamableHttpClientTransport, TokioChildProcess,
        streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde::Serialize;
use tokio::sync::{Mutex, Semaphore, mpsc};

use crate::{ToolListing, UpstreamConfig, UpstreamError, expand_env, listing::list_all_tools};

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
}

type Client = RunningService<RoleClient, UpstreamHandler>;

struct Live {
    client: Client,
    era: Era,
    protocol_version: String,
    pid: Option<u32>,
    /// Ends the supervisor watch for this particular connection.
    generation: u64,
}

/// One upstream MCP server. Cheap to share; every method is safe to call
/// concurrently.
pub struct Upstream {
    config: UpstreamConfig,
    live: Mutex<Option<Live>>,
    /// Readable without awaiting, for status snapshots.
    state: StdMutex<(UpstreamState, Option<Era>, Option<String>, Option<u32>)>,
    calls: Arc<Semaphore>,
    events: mpsc::UnboundedSender<UpstreamEvent>,
    restarts: AtomicU32,
    /// Set by `disable`; stops the supervisor from restarting.
    disabled: AtomicBool,
    generation: AtomicU32,
}

impl Upstream {
    pub fn new(config: UpstreamConfig, events: mpsc::UnboundedSender<UpstreamEvent>) -> Arc<Self> {
        Arc::new(Self {
            calls: Arc::new(Semaphore::new(config.max_concurrency)),
            config,
            live: Mutex::new(None),
            state: StdMutex::new((UpstreamState::NotConnected, None, None, None)),
            events,
            restarts: AtomicU32::new(0),
            disabled: AtomicBool::new(false),
            generation: AtomicU32::new(0),
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
        }
    }

    pub fn is_connected(&self) -> bool {
        matches!(self.status().state, UpstreamState::Connected)
    }

    fn set_state(&self, state: UpstreamState, live: Option<&Live>) {
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
        };
        let lifecycle = ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: None,
        };
        let generation = u64::from(self.generation.fetch_add(1, Ordering::SeqCst)) + 1;
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
            let config =
                StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(headers);
            let transport = StreamableHttpClientTransport::from_config(config);
            let client = handler
                .serve_with_lifecycle(transport, lifecycle)
                .await
                .map_err(|e| connect_err(e.to_string()))?;
            (client, None)
        } else {
            let command = self.config.command.as_deref().unwrap_or_default();
            let mut cmd = tokio::process::Command::new(command);
            for arg in &self.config.args {
                cmd.arg(expand_env(arg).map_err(connect_err)?);
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
                .serve_with_lifecycle(transport, lifecycle)
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
        let era = if protocol_version.as_str() >= "2026-07-28" {
            Era::Modern
        } else {
            Era::Legacy
        };
        Ok(Live {
            client,
            era,
            protocol_version,
            pid,
            generation,
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
        let filter = SubscriptionFilter::builder().tools_list_changed().build();
        let Ok(mut subscription) = peer.listen(filter).await else {
            tracing::debug!(server = %self.config.name, "upstream refused subscriptions/listen");
            return;
        };
        while let Ok(Some(_notification)) = subscription.next().await {
            let _ = self.events.send(UpstreamEvent::ToolsChanged {
                server: self.config.name.clone(),
            });
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
        let old = self.live.lock().await.take();
        if let Some(old) = old {
            let _ = old.client.cancel().await;
        }
        self.set_state(UpstreamState::NotConnected, None);
    }

    async fn peer(&self) -> Result<Peer<RoleClient>, UpstreamError> {
        let live = self.live.lock().await;
        match live.as_ref() {
            Some(l) if !l.client.is_transport_closed() => Ok(l.client.peer().clone()),
            _ => Err(UpstreamError::NotConnected {
                server: self.config.name.clone(),
            }),
        }
    }

    /// All tools of this upstream, paged with guards, within `list_timeout_ms`.
    pub async fn list_tools(&self) -> Result<ToolListing, UpstreamError> {
        let peer = self.peer().await?;
        let timeout = Duration::from_millis(self.config.list_timeout_ms);
        match tokio::time::timeout(
            timeout,
            list_all_tools(&self.config.name, &peer, self.config.max_pages),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(UpstreamError::Timeout {
                server: self.config.name.clone(),
                operation: "tools/list",
                timeout_ms: self.config.list_timeout_ms,
            }),
        }
    }

    /// Forward one `tools/call`, holding a concurrency permit, within `call_timeout_ms`.
    pub async fn call_tool(
        &self,
        tool: &str,
        arguments: Option<JsonObject>,
    ) -> Result<CallToolResponse, UpstreamError> {
        let started = Instant::now();
        let timeout = Duration::from_millis(self.config.call_timeout_ms);
        let server = &self.config.name;
        let work = async {
            let _permit = self.calls.acquire().await.expect("semaphore never closed");
            let peer = self.peer().await?;
            let mut params = CallToolRequestParams::new(tool.to_string());
            params.arguments = arguments;
            peer.call_tool_once(params)
                .await
                .map_err(|e| UpstreamError::Protocol {
                    server: server.clone(),
                    message: format!("tools/call {tool} failed: {e}"),
                })
        };
        let result = match tokio::time::timeout(timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(UpstreamError::Timeout {
                server: server.clone(),
                operation: "tools/call",
                timeout_ms: self.config.call_timeout_ms,
            }),
        };
        tracing::debug!(server = %server, tool, elapsed_ms = started.elapsed().as_millis() as u64, ok = result.is_ok(), "upstream call");
        result
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

/// Receives upstream notifications for the catalog.
#[derive(Clone)]
pub(crate) struct UpstreamHandler {
    server: String,
    events: mpsc::UnboundedSender<UpstreamEvent>,
}

impl ClientHandler for UpstreamHandler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.events.send(UpstreamEvent::ToolsChanged {
            server: self.server.clone(),
        });
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("manifold", env!("CARGO_PKG_VERSION")),
        )
    }
}
