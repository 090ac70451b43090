//! The gateway's OAuth client state on the store: the vault the upstream
//! crate keeps tokens in, the secret that seals them, and `manifold auth
//! login SERVER`, which signs the gateway in to an upstream.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Context, bail};
use async_trait::async_trait;
use clap::Subcommand;
use manifold_config::Config;
use manifold_store::{
    Backend, Store, now_ms,
    oauth::{PENDING_MAX_AGE_MS, Sealer},
};
use manifold_upstream::{
    UpstreamAuth,
    oauth::{OAuthClient, OAuthVault},
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a refresh may hold the lease before another replica may take it.
const LEASE: Duration = Duration::from_secs(30);
/// How long a sign-in waits for the browser to come back.
const SIGN_IN_WAIT: Duration = Duration::from_secs(600);

/// The store as the upstream crate's token vault.
pub struct StoreVault {
    store: Store,
    sealer: Arc<Sealer>,
    /// This process, as the holder of refresh leases.
    owner: String,
}

impl StoreVault {
    pub fn new(store: Store, sealer: Sealer) -> StoreVault {
        StoreVault {
            store,
            sealer: Arc::new(sealer),
            owner: format!("{}-{}", std::process::id(), Sealer::generate_secret()),
        }
    }
}

/// Releases a refresh lease when dropped.
struct Lease {
    store: Store,
    server: String,
    principal: String,
    owner: String,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let (store, server, principal, owner) = (
            self.store.clone(),
            std::mem::take(&mut self.server),
            std::mem::take(&mut self.principal),
            std::mem::take(&mut self.owner),
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(error) = store.release_oauth_lease(&server, &principal, &owner).await {
                    tracing::warn!(%error, server, "OAuth refresh lease not released; it runs out by itself");
                }
            });
        }
    }
}

#[async_trait]
impl OAuthVault for StoreVault {
    async fn load(&self, server: &str, principal: &str) -> Result<Option<Vec<u8>>, String> {
        self.store
            .oauth_credentials(&self.sealer, server, principal)
            .await
            .map(|c| c.map(|c| c.plain))
            .map_err(|e| e.to_string())
    }

    async fn save(&self, server: &str, principal: &str, plain: Vec<u8>) -> Result<(), String> {
        self.store
            .save_oauth_credentials(&self.sealer, server, principal, &plain, now_ms())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn clear(&self, server: &str, principal: &str) -> Result<(), String> {
        self.store
            .clear_oauth_credentials(server, principal)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn save_pending(
        &self,
        state: &str,
        server: &str,
        principal: &str,
        plain: Vec<u8>,
    ) -> Result<(), String> {
        let now = now_ms();
        // Abandoned sign-ins go when new ones start.
        let _ = self
            .store
            .delete_oauth_pending("", Some(now - PENDING_MAX_AGE_MS))
            .await;
        self.store
            .save_oauth_pending(&self.sealer, state, server, principal, &plain, now)
            .await
            .map_err(|e| e.to_string())
    }

    async fn load_pending(&self, state: &str) -> Result<Option<(String, String, Vec<u8>)>, String> {
        self.store
            .oauth_pending(&self.sealer, state, now_ms(), PENDING_MAX_AGE_MS)
            .await
            .map_err(|e| e.to_string())
    }

    async fn delete_pending(&self, state: &str) -> Result<(), String> {
        self.store
            .delete_oauth_pending(state, None)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn link_pending(&self, state: &str, authorize_url: &str) -> Result<(), String> {
        self.store
            .link_oauth_pending(state, authorize_url)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn save_client(&self, server: &str, plain: Vec<u8>) -> Result<(), String> {
        self.store
            .save_oauth_client(&self.sealer, server, &plain, now_ms())
            .await
            .map_err(|e| e.to_string())
    }

    async fn load_client(&self, server: &str) -> Result<Option<Vec<u8>>, String> {
        self.store
            .oauth_client(&self.sealer, server)
            .await
            .map_err(|e| e.to_string())
    }

    async fn lease(&self, server: &str, principal: &str) -> Result<Box<dyn Send>, String> {
        let lease_ms = LEASE.as_millis() as i64;
        let deadline = tokio::time::Instant::now() + LEASE + Duration::from_secs(5);
        loop {
            let now = now_ms();
            let taken = self
                .store
                .take_oauth_lease(server, principal, &self.owner, now, now + lease_ms)
                .await
                .map_err(|e| e.to_string())?;
            if taken {
                return Ok(Box::new(Lease {
                    store: self.store.clone(),
                    server: server.to_string(),
                    principal: principal.to_string(),
                    owner: self.owner.clone(),
                }));
            }
            if self
                .store
                .oauth_credentials(&self.sealer, server, principal)
                .await
                .map_err(|e| e.to_string())?
                .is_none()
            {
                // Nothing stored: nothing to refresh, nobody to wait for.
                return Ok(Box::new(()));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "another replica has held the refresh lease of {server} for over {} s",
                    LEASE.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The sealer for OAuth secrets: `MANIFOLD_SECRET_KEY`, else `[store]
/// secret_key_file`, else (SQLite only) `secret.key` in the data dir, made
/// on first use with mode 0600. On PostgreSQL every replica must share the
/// key, so one has to be given.
pub fn sealer(config: &Config, backend: Backend) -> anyhow::Result<Sealer> {
    if let Ok(secret) = std::env::var("MANIFOLD_SECRET_KEY")
        && !secret.trim().is_empty()
    {
        return Sealer::new(secret.as_bytes()).context("MANIFOLD_SECRET_KEY");
    }
    let file: PathBuf = match &config.store.secret_key_file {
        Some(path) if path.is_absolute() => path.clone(),
        Some(path) => config.base_dir.join(path),
        None if backend == Backend::Sqlite => {
            let path = config.data_dir().join("secret.key");
            if !path.exists() {
                write_private(&path, &Sealer::generate_secret())?;
            }
            path
        }
        None => bail!(
            "OAuth tokens are sealed with a secret every replica shares: set MANIFOLD_SECRET_KEY or [store] secret_key_file"
        ),
    };
    let secret = std::fs::read(&file)
        .with_context(|| format!("cannot read secret key {}", file.display()))?;
    Sealer::new(&secret).with_context(|| format!("secret key {}", file.display()))
}

/// This replica's stable id, kept in `replica.id` in its data dir (made on
/// first start): the tasks made through it are marked with it, and the
/// ones it runs failed when it starts again.
pub fn replica_id(config: &Config) -> anyhow::Result<String> {
    let path = config.data_dir().join("replica.id");
    if !path.exists() {
        write_private(&path, Sealer::generate_secret().trim_end_matches('='))?;
    }
    let id = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(id.trim().to_string())
}

fn write_private(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    std::io::Write::write_all(&mut file, text.as_bytes())?;
    Ok(())
}

/// The upstreams' OAuth client: the store as their vault when the config
/// has an `oauth` server, and the callback at `[gateway] public_url`.
pub fn client(config: &Config, store: &Store) -> anyhow::Result<OAuthClient> {
    let vault: Option<Arc<dyn OAuthVault>> = if config
        .servers
        .iter()
        .any(|s| s.auth == Some(UpstreamAuth::Oauth))
    {
        let sealer = sealer(config, store.backend())?;
        Some(Arc::new(StoreVault::new(store.clone(), sealer)))
    } else {
        None
    };
    Ok(OAuthClient::new(
        vault,
        config.gateway.public_url.as_deref(),
    ))
}

#[derive(Subcommand)]
pub enum AuthCommand {
    /// Sign the gateway in to an `auth = "oauth"` server: prints a URL to
    /// open, waits for the browser on a loopback callback, and keeps the
    /// tokens (sealed) in the store, where every replica finds them.
    Login {
        server: String,
        #[arg(long)]
        config: PathBuf,
        /// The loopback port of the callback (default: any free one).
        #[arg(long, default_value_t = 0)]
        port: u16,
    },
    /// Forget the gateway's tokens for a server.
    Logout {
        server: String,
        #[arg(long)]
        config: PathBuf,
    },
    /// The adapter the MCP conformance suite runs as its client.
    #[command(hide = true)]
    ConformanceClient { url: String },
}

pub async fn run(command: AuthCommand) -> anyhow::Result<()> {
    match command {
        AuthCommand::Login {
            server,
            config,
            port,
        } => login(&Config::load(&config)?, &server, port).await,
        AuthCommand::ConformanceClient { url } => conformance_client(&url).await,
        AuthCommand::Logout { server, config } => {
            let config = Config::load(&config)?;
            let store = config.open_store().await?;
            let forgot = store.clear_oauth_credentials(&server, "").await?;
            println!(
                "{}",
                if forgot {
                    format!("signed out of {server}")
                } else {
                    format!("no tokens kept for {server}")
                }
            );
            Ok(())
        }
    }
}

async fn login(config: &Config, name: &str, port: u16) -> anyhow::Result<()> {
    let server = config
        .servers
        .iter()
        .find(|s| s.name == name)
        .with_context(|| format!("no server named {name:?} in the config"))?;
    if server.auth != Some(UpstreamAuth::Oauth) {
        bail!("server {name:?} does not have auth = \"oauth\"");
    }
    if server.credentials == manifold_upstream::Credentials::PerPrincipal {
        bail!(
            "server {name:?} has credentials = \"per_principal\": each caller signs in for itself, from the URL its first call answers"
        );
    }
    let store = config.open_store().await?;
    let vault: Arc<dyn OAuthVault> = Arc::new(StoreVault::new(
        store.clone(),
        sealer(config, store.backend())?,
    ));
    sign_in(server, vault, port, |url| {
        println!("Open this URL to sign in to {name}:\n{url}");
    })
    .await?;
    println!("signed in to {name}; the gateway uses these tokens from now on");
    Ok(())
}

/// Signs the gateway in to `server`: discovery (from the server's 401
/// challenge when it gives one), registration (pre-registered or dynamic),
/// authorization code with PKCE on a loopback callback, and the tokens into
/// `vault`. `open` is shown the URL a person (or a test) must visit.
pub async fn sign_in(
    server: &manifold_upstream::UpstreamConfig,
    vault: Arc<dyn OAuthVault>,
    port: u16,
    open: impl FnOnce(&str),
) -> anyhow::Result<()> {
    let name = &server.name;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .context("cannot listen for the sign-in callback")?;
    let redirect_uri = format!(
        "http://127.0.0.1:{}/callback",
        listener.local_addr()?.port()
    );
    let (manager, url) = OAuthClient::new(Some(vault), None)
        .begin_sign_in(server, "", &redirect_uri)
        .await
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("signing in to {name}"))?;
    open(&url);
    let callback = tokio::time::timeout(SIGN_IN_WAIT, wait_for_callback(&listener))
        .await
        .context("no sign-in within 10 minutes")??;
    manager
        .exchange_code_for_token_with_issuer(
            &callback.code,
            &callback.state,
            callback.issuer.as_deref(),
        )
        .await
        .context("exchanging the authorization code")?;
    Ok(())
}

/// The adapter the MCP conformance suite starts as its client (`conformance
/// client --command "manifold auth conformance-client"`, the server URL
/// appended): the gateway's own upstream OAuth client signs in (the suite's
/// authorization server approves by itself; the adapter follows its
/// redirects as a browser would), connects as the gateway does, lists the
/// tools and calls the first one. Tokens go through a throwaway store.
pub async fn conformance_client(url: &str) -> anyhow::Result<()> {
    let context: serde_json::Value = std::env::var("MCP_CONFORMANCE_CONTEXT")
        .ok()
        .and_then(|c| serde_json::from_str(&c).ok())
        .unwrap_or_default();
    let dir = tempfile::tempdir()?;
    let store = Store::open_data_dir(dir.path()).await?;
    let vault: Arc<dyn OAuthVault> = Arc::new(StoreVault::new(
        store,
        Sealer::new(Sealer::generate_secret().as_bytes())?,
    ));
    let mut server = manifold_upstream::UpstreamConfig::http("conformance", url);
    server.auth = Some(UpstreamAuth::Oauth);
    if let Some(id) = context.get("client_id").and_then(|v| v.as_str()) {
        server.client_id = Some(id.to_string());
        if let Some(secret) = context.get("client_secret").and_then(|v| v.as_str()) {
            // SAFETY of set_var: single-threaded use before any task reads it.
            unsafe { std::env::set_var("MANIFOLD_CONFORMANCE_CLIENT_SECRET", secret) };
            server.client_secret_env = Some("MANIFOLD_CONFORMANCE_CLIENT_SECRET".into());
        }
    }
    let browser = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    sign_in(&server, vault.clone(), 0, |url| {
        let (browser, url) = (browser.clone(), url.to_string());
        tokio::spawn(async move {
            if let Err(error) = browser.get(&url).send().await {
                eprintln!("conformance-client: following the authorization URL: {error}");
            }
        });
    })
    .await?;
    let (events, _keep) = tokio::sync::mpsc::unbounded_channel();
    let upstream =
        manifold_upstream::Upstream::new(server, events, OAuthClient::new(Some(vault), None));
    upstream.connect().await?;
    let tools = upstream.list_tools().await?;
    if let Some(tool) = tools.items.first() {
        let result = upstream
            .call_tool_with(&tool.name, None, &Default::default())
            .await?;
        eprintln!("conformance-client: called {}: {result:?}", tool.name);
    }
    upstream.disconnect().await;
    Ok(())
}

struct Callback {
    code: String,
    state: String,
    issuer: Option<String>,
}

/// Answers requests on the loopback listener until one is the callback.
async fn wait_for_callback(listener: &tokio::net::TcpListener) -> anyhow::Result<Callback> {
    loop {
        let (mut socket, _) = listener.accept().await?;
        let mut buffer = vec![0u8; 16 * 1024];
        let mut read = 0;
        while read < buffer.len() {
            let n = socket.read(&mut buffer[read..]).await?;
            read += n;
            if n == 0 || buffer[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        let head = String::from_utf8_lossy(&buffer[..read]);
        let target = head
            .lines()
            .next()
            .and_then(|line| line.split_whitespace().nth(1))
            .unwrap_or_default();
        let Some(query) = target.strip_prefix("/callback?") else {
            let _ = socket
                .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                .await;
            continue;
        };
        let params: std::collections::HashMap<String, String> = url_params(query);
        if let Some(error) = params.get("error") {
            let _ = socket
                .write_all(
                    b"HTTP/1.1 400 Bad Request\r\ncontent-length: 16\r\n\r\nsign-in refused\n",
                )
                .await;
            bail!(
                "the authorization server refused: {error} {}",
                params.get("error_description").map_or("", String::as_str)
            );
        }
        let body = "Signed in. You may close this tab.\n";
        let _ = socket
            .write_all(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
            .await;
        match (params.get("code"), params.get("state")) {
            (Some(code), Some(state)) => {
                return Ok(Callback {
                    code: code.clone(),
                    state: state.clone(),
                    issuer: params.get("iss").cloned(),
                });
            }
            _ => bail!("the callback has no code and state"),
        }
    }
}

fn url_params(query: &str) -> std::collections::HashMap<String, String> {
    reqwest::Url::parse(&format!("http://x/?{query}"))
        .map(|url| url.query_pairs().into_owned().collect())
        .unwrap_or_default()
}
