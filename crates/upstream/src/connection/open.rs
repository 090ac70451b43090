//! Opening a connection to an upstream: the transport (a stdio child, or
//! Streamable HTTP or legacy HTTP+SSE, with or without OAuth), the era the two sides agree on,
//! and the plain POST a stateless HTTP upstream's calls take.
//!
//! A [`Connection`] is one connection and what the requests over it share:
//! the server's own, or on a per-principal server one caller's. It opens
//! again when the old one is gone; who decides when is the caller's
//! business (supervision for the server's own, the caller's next request for
//! a per-principal one).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex as StdMutex,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use rmcp::{
    ClientCacheConfig, ClientLifecycleMode, ClientServiceExt, RoleClient,
    model::ProtocolVersion,
    service::{Peer, RunningService},
    transport::{
        StreamableHttpClientTransport, TokioChildProcess,
        streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde::Serialize;
use tokio::sync::{Mutex, MutexGuard, Semaphore, mpsc};

use super::handler::{UpstreamHandler, handler_info};
use crate::{
    DEFAULT_INHERITED_ENV, HttpTransport, ServerOrigin, UpstreamConfig, UpstreamError,
    UpstreamEvent,
    address::{self, SystemResolver},
    expand_env,
    oauth::OAuthClient,
    plain::{ParamHeaderTools, PlainPost},
    relay::{RelayInOrder, Routes},
    sse::{self, SseClientTransport},
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

#[derive(Debug, Clone, Serialize)]
pub struct LastError {
    pub at_ms: i64,
    pub operation: &'static str,
    pub message: String,
}

type Client = RunningService<RoleClient, UpstreamHandler>;

/// How long rmcp's `Auto` lifecycle waits for `server/discover` before it
/// falls back to `initialize` (its fixed `DEFAULT_AUTO_DISCOVER_TIMEOUT`).
const AUTO_DISCOVER_WAIT: Duration = Duration::from_secs(10);

/// An open connection.
pub(super) struct Live {
    client: Client,
    pub(super) era: Era,
    pub(super) protocol_version: String,
    pub(super) pid: Option<u32>,
    /// The transport a `url` server's connection uses.
    pub(super) transport: Option<HttpTransport>,
    /// Tells the supervisor's watch which connection it watches.
    pub(super) generation: u64,
    /// Set for a stateless HTTP upstream: plain calls skip rmcp's client.
    plain: Option<Arc<PlainPost>>,
}

impl Live {
    pub(super) fn peer(&self) -> &Peer<RoleClient> {
        self.client.peer()
    }

    /// Ends the session: a stdio child is killed and reaped.
    async fn close(self) {
        let _ = self.client.cancel().await;
    }
}

/// What one request needs of the open connection.
pub(super) struct Connected {
    pub(super) peer: Peer<RoleClient>,
    pub(super) era: Era,
    pub(super) plain: Option<Arc<PlainPost>>,
}

/// One connection to an upstream and what the requests over it share. Every
/// method is safe to call concurrently.
pub(super) struct Connection {
    pub(super) config: Arc<UpstreamConfig>,
    live: Mutex<Option<Live>>,
    /// Caps the requests in flight (`max_concurrency`).
    pub(super) calls: Semaphore,
    /// In-flight forwarded requests and where their progress, logs and
    /// server-to-client requests go.
    pub(super) routes: Arc<Routes>,
    pub(super) param_header_tools: ParamHeaderTools,
    /// An `oauth` server with no usable tokens: someone has to sign in.
    needs_sign_in: AtomicBool,
    /// The newest failed request.
    last_error: StdMutex<Option<LastError>>,
    generation: AtomicU32,
}

impl Connection {
    pub(super) fn new(config: &Arc<UpstreamConfig>) -> Self {
        Self {
            config: Arc::clone(config),
            live: Mutex::new(None),
            calls: Semaphore::new(config.max_concurrency),
            routes: Arc::default(),
            param_header_tools: ParamHeaderTools::default(),
            needs_sign_in: AtomicBool::new(false),
            last_error: StdMutex::new(None),
            generation: AtomicU32::new(0),
        }
    }

    /// The slot to open a connection into, locked, or `None` while one is
    /// open: concurrent callers share one attempt. A connection that died
    /// is dropped here, which reaps a stdio child.
    pub(super) async fn vacant(&self) -> Option<MutexGuard<'_, Option<Live>>> {
        let mut live = self.live.lock().await;
        if let Some(existing) = live.as_ref() {
            if !existing.client.is_transport_closed() {
                return None;
            }
            *live = None;
        }
        Some(live)
    }

    pub(super) async fn is_open(&self) -> bool {
        self.live
            .lock()
            .await
            .as_ref()
            .is_some_and(|live| !live.client.is_transport_closed())
    }

    /// What a request needs of the open connection.
    pub(super) async fn connected(&self) -> Result<Connected, UpstreamError> {
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

    pub(super) async fn current_generation(&self) -> Option<u64> {
        self.live.lock().await.as_ref().map(|l| l.generation)
    }

    /// Closes the connection if it is still `generation`'s; `false` if it
    /// is not.
    pub(super) async fn close_if(&self, generation: u64) -> bool {
        let mut live = self.live.lock().await;
        if live.as_ref().map(|l| l.generation) != Some(generation) {
            return false;
        }
        if let Some(old) = live.take() {
            old.close().await;
        }
        true
    }

    /// Closes the connection; dropping the client kills and reaps a stdio
    /// child, so no zombies.
    pub(super) async fn close(&self) {
        let old = self.live.lock().await.take();
        if let Some(old) = old {
            old.close().await;
        }
    }

    /// Waits until no request holds a call permit, at most `timeout`.
    pub(super) async fn drain(&self, timeout: Duration) {
        let permits = u32::try_from(self.config.max_concurrency).unwrap_or(u32::MAX);
        if tokio::time::timeout(timeout, self.calls.acquire_many(permits))
            .await
            .is_err()
        {
            tracing::warn!(server = %self.config.name, "calls still in flight at the drain deadline");
        }
    }

    pub(super) fn needs_sign_in(&self) -> bool {
        self.needs_sign_in.load(Ordering::Relaxed)
    }

    pub(super) fn set_needs_sign_in(&self) {
        self.needs_sign_in.store(true, Ordering::Relaxed);
    }

    pub(super) fn last_error(&self) -> Option<LastError> {
        self.last_error.lock().expect("last error lock").clone()
    }

    pub(super) fn record_error(&self, operation: &'static str, error: &UpstreamError) {
        *self.last_error.lock().expect("last error lock") = Some(LastError {
            at_ms: now_ms(),
            operation,
            message: error.to_string(),
        });
    }

    /// Opens a connection within `connect_timeout_ms`, as `principal` on a
    /// per-principal server.
    pub(super) async fn open(
        &self,
        principal: Option<&str>,
        events: &mpsc::UnboundedSender<UpstreamEvent>,
        oauth: &OAuthClient,
    ) -> Result<Live, UpstreamError> {
        let config = &self.config;
        let timeout = Duration::from_millis(config.connect_timeout_ms);
        match tokio::time::timeout(timeout, self.open_now(principal, events, oauth)).await {
            Ok(opened) => opened,
            Err(_) => Err(UpstreamError::Timeout {
                server: config.name.clone(),
                operation: "connect",
                timeout_ms: config.connect_timeout_ms,
            }),
        }
    }

    async fn open_now(
        &self,
        principal: Option<&str>,
        events: &mpsc::UnboundedSender<UpstreamEvent>,
        oauth: &OAuthClient,
    ) -> Result<Live, UpstreamError> {
        let config = &self.config;
        let name = &config.name;
        let connect_err = |reason: String| UpstreamError::Connect {
            server: name.clone(),
            reason,
        };
        let listener = UpstreamHandler::new(name, events, &self.routes);
        let lifecycle = ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: None,
        };
        let generation = u64::from(self.generation.fetch_add(1, Ordering::SeqCst)) + 1;
        let mut plain_http = None;
        let (client, pid, transport) = if let Some(url) = &config.url {
            let mut headers = HashMap::new();
            for (k, v) in &config.headers {
                let value = expand_env(v).map_err(connect_err)?;
                let key = http::HeaderName::try_from(k.as_str())
                    .map_err(|e| connect_err(format!("bad header name {k:?}: {e}")))?;
                let value = http::HeaderValue::try_from(value)
                    .map_err(|_| connect_err(format!("bad value for header {k:?}")))?;
                headers.insert(key, value);
            }
            // Keep-alive: a call reuses an idle connection instead of paying
            // a TCP handshake. Idle ones close after 4 s, under the 5 s
            // keep-alive of common Python servers, so a reused connection is
            // rarely one the upstream is closing. Same-origin 307/308
            // redirects only, plus the trace context as a header.
            let mut builder = reqwest::Client::builder()
                .pool_idle_timeout(Duration::from_secs(4))
                .redirect(crate::trace::same_origin_redirects());
            // A runtime server's name is resolved and checked now, at every
            // connect, and the connection goes to the checked address.
            let pinned = match config.origin {
                ServerOrigin::Runtime => Some(
                    address::check_url(url, &config.allowed_private_hosts, &SystemResolver)
                        .await
                        .map_err(|e| connect_err(e.to_string()))?,
                ),
                ServerOrigin::Config => None,
            };
            if let (Some(addr), Some(host)) = (
                pinned,
                reqwest::Url::parse(url)
                    .ok()
                    .and_then(|u| u.host_str().map(str::to_string)),
            ) {
                builder = builder.resolve(&host, addr);
            }
            let reqwest = builder.build().map_err(|e| connect_err(e.to_string()))?;
            let http = crate::trace::TracingHttpClient(reqwest.clone());
            let oauth_client = if config.auth == Some(crate::UpstreamAuth::Oauth) {
                // Every request carries the token and refreshes it when due;
                // the plain fast path would go without it.
                let principal = principal.unwrap_or_default();
                let manager = oauth.signed_in_manager(config, principal).await;
                self.needs_sign_in.store(
                    manager
                        .as_ref()
                        .is_err_and(|e| *e == crate::oauth::sign_in_hint(name)),
                    Ordering::Relaxed,
                );
                let manager = manager.map_err(connect_err)?;
                Some(rmcp::transport::auth::AuthClient::new(
                    http.clone(),
                    manager,
                ))
            } else {
                None
            };
            let streamable = || async {
                let transport_config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(headers.clone());
                let handler = UpstreamHandler::new(name, events, &self.routes);
                match &oauth_client {
                    Some(auth) => {
                        let transport = StreamableHttpClientTransport::with_client(
                            auth.clone(),
                            transport_config,
                        );
                        handler
                            .serve_with_lifecycle(
                                RelayInOrder::new(transport, &self.routes),
                                lifecycle.clone(),
                            )
                            .await
                    }
                    None => {
                        let transport = StreamableHttpClientTransport::with_client(
                            http.clone(),
                            transport_config,
                        );
                        handler
                            .serve_with_lifecycle(
                                RelayInOrder::new(transport, &self.routes),
                                lifecycle.clone(),
                            )
                            .await
                    }
                }
                .map_err(|e| e.to_string())
            };
            let legacy_sse = || async {
                let transport = SseClientTransport::connect(
                    reqwest.clone(),
                    url,
                    headers.clone(),
                    oauth_client.clone(),
                    Duration::from_millis(config.call_timeout_ms),
                )
                .await?;
                UpstreamHandler::new(name, events, &self.routes)
                    .serve_with_lifecycle(
                        RelayInOrder::new(transport, &self.routes),
                        ClientLifecycleMode::Initialize,
                    )
                    .await
                    .map_err(|e| e.to_string())
            };
            let (client, used) = match config.transport.unwrap_or_default() {
                HttpTransport::Sse => (legacy_sse().await, HttpTransport::Sse),
                HttpTransport::StreamableHttp => {
                    (streamable().await, HttpTransport::StreamableHttp)
                }
                HttpTransport::Auto => match streamable().await {
                    Ok(client) => (Ok(client), HttpTransport::StreamableHttp),
                    // The 2024-11-05 backwards-compatibility procedure: a
                    // POST answered 400, 404 or 405 means the old transport.
                    Err(error)
                        if sse::post_is_refused(&reqwest, url, &headers, oauth_client.as_ref())
                            .await =>
                    {
                        tracing::debug!(server = %name, %error, "Streamable HTTP refused; trying SSE");
                        let sse = legacy_sse()
                            .await
                            .map_err(|sse| format!("Streamable HTTP: {error}; legacy SSE: {sse}"));
                        (sse, HttpTransport::Sse)
                    }
                    Err(error) => (Err(error), HttpTransport::StreamableHttp),
                },
            };
            let client = client.map_err(connect_err)?;
            tracing::info!(server = %name, transport = used.as_str(), "upstream transport chosen");
            if oauth_client.is_none() && config.plain_calls && used == HttpTransport::StreamableHttp
            {
                plain_http = Some((reqwest, url.clone(), headers, pinned));
            }
            (client, None, Some(used))
        } else {
            let started = Instant::now();
            let (client, pid) = match self.start_child(events, lifecycle).await {
                Ok(started) => started,
                // rmcp's `Auto` gives `server/discover` 10 s, then starts
                // over with `initialize` on the same pipe; a child slower
                // than that answers the probe late and the handshake fails
                // ("conflict initialized response id"). Such a child is
                // started again with `initialize` alone, which waits as long
                // as the connect timeout allows.
                Err(error) if started.elapsed() >= AUTO_DISCOVER_WAIT => {
                    tracing::info!(server = %name, %error, "slow to start: starting it again with initialize");
                    self.start_child(events, ClientLifecycleMode::Initialize)
                        .await?
                }
                Err(error) => return Err(error),
            };
            (client, pid, None)
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
        if era == Era::Modern {
            // List changes come on a `subscriptions/listen` stream.
            let peer = client.peer().clone();
            tokio::spawn(async move { listener.listen_for_changes(peer).await });
        }
        Ok(Live {
            client,
            era,
            protocol_version,
            pid,
            transport,
            generation,
            plain,
        })
    }

    /// Spawns the stdio child with only the environment it may have, and
    /// runs the handshake `lifecycle` says over its pipes.
    async fn start_child(
        &self,
        events: &mpsc::UnboundedSender<UpstreamEvent>,
        lifecycle: ClientLifecycleMode,
    ) -> Result<(Client, Option<u32>), UpstreamError> {
        let config = &self.config;
        let name = &config.name;
        let connect_err = |reason: String| UpstreamError::Connect {
            server: name.clone(),
            reason,
        };
        let command = config.command.as_deref().unwrap_or_default();
        let mut cmd = tokio::process::Command::new(command);
        for arg in &config.args {
            cmd.arg(expand_env(arg).map_err(connect_err)?);
        }
        // The gateway's environment holds its database URL and other
        // servers' secrets: a child gets only what the MCP SDKs pass by
        // default, what its entry names in `inherit_env`, and its `env`.
        cmd.env_clear();
        let inherited = DEFAULT_INHERITED_ENV
            .iter()
            .copied()
            .chain(config.inherit_env.iter().map(String::as_str));
        for name in inherited {
            if let Some(value) = std::env::var_os(name) {
                cmd.env(name, value);
            }
        }
        for (k, v) in &config.env {
            cmd.env(k, expand_env(v).map_err(connect_err)?);
        }
        if let Some(cwd) = &config.cwd {
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
        let client = UpstreamHandler::new(name, events, &self.routes)
            .serve_with_lifecycle(RelayInOrder::new(transport, &self.routes), lifecycle)
            .await
            .map_err(|e| connect_err(e.to_string()))?;
        Ok((client, pid))
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

pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
