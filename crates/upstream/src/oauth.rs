//! The gateway as an OAuth client of an upstream (`[[servers]] auth =
//! "oauth"`), on rmcp's `auth` client: discovery of the server's
//! protected-resource metadata and its authorization server, dynamic or
//! pre-registered clients, authorization code with PKCE, and refresh before
//! expiry and on a 401 (`AuthClient`).
//!
//! Tokens live in an [`OAuthVault`] the binary provides (the store, sealed),
//! so every replica uses them and a restart needs no new sign-in; each
//! upstream holds it in an [`OAuthClient`]. A refresh
//! holds the vault's lease, so two replicas never spend one refresh token
//! twice (a provider that rotates refresh tokens revokes the grant when one
//! is reused).

use std::sync::Arc;

use async_trait::async_trait;
use rmcp::transport::auth::{
    AuthError, AuthorizationManager, CredentialRefreshGuard, CredentialStore, OAuthClientConfig,
    StateStore, StoredAuthorizationState, StoredCredentials,
};

use crate::UpstreamConfig;

/// Where OAuth tokens are kept: per server, and per principal (`""` for the
/// server's shared credentials).
#[async_trait]
pub trait OAuthVault: Send + Sync {
    async fn load(&self, server: &str, principal: &str) -> Result<Option<Vec<u8>>, String>;
    async fn save(&self, server: &str, principal: &str, plain: Vec<u8>) -> Result<(), String>;
    async fn clear(&self, server: &str, principal: &str) -> Result<(), String>;
    /// Waits (bounded) until this process holds the refresh lease; the lease
    /// ends when the returned guard is dropped.
    async fn lease(&self, server: &str, principal: &str) -> Result<Box<dyn Send>, String>;
    /// A sign-in under way (its PKCE verifier), under its CSRF state, for
    /// whichever replica gets the callback.
    async fn save_pending(
        &self,
        state: &str,
        server: &str,
        principal: &str,
        plain: Vec<u8>,
    ) -> Result<(), String>;
    /// (server, principal, secret) of a sign-in under way.
    async fn load_pending(&self, state: &str) -> Result<Option<(String, String, Vec<u8>)>, String>;
    async fn delete_pending(&self, state: &str) -> Result<(), String>;
    /// Keeps the authorization server's URL of the sign-in under `state`,
    /// for the gateway's sign-in page to send the browser on to.
    async fn link_pending(&self, state: &str, authorize_url: &str) -> Result<(), String>;
    /// The client the gateway is registered as with a server's
    /// authorization server.
    async fn save_client(&self, server: &str, plain: Vec<u8>) -> Result<(), String>;
    async fn load_client(&self, server: &str) -> Result<Option<Vec<u8>>, String>;
}

/// Where an authorization server sends the browser back, on the gateway.
pub const CALLBACK_PATH: &str = "/oauth/callback";
/// The gateway's page where a caller's sign-in to a per-principal server
/// starts: the link an `auth_required` answer gives.
pub const SIGN_IN_PATH: &str = "/oauth/sign-in";

/// The gateway as an OAuth client of its `oauth` upstreams: the vault their
/// tokens live in, and the public URL callers' sign-ins to per-principal
/// servers start at ([`SIGN_IN_PATH`]) and return to ([`CALLBACK_PATH`]).
/// The binary makes it once; every upstream holds a copy. Without a vault an
/// `oauth` server cannot connect.
#[derive(Clone, Default)]
pub struct OAuthClient {
    vault: Option<Arc<dyn OAuthVault>>,
    callback_url: Option<Arc<str>>,
    sign_in_page: Option<Arc<str>>,
}

impl OAuthClient {
    /// `public_url`: where browsers reach the gateway (`[gateway]
    /// public_url`); without it, callers cannot sign in to per-principal
    /// servers.
    pub fn new(vault: Option<Arc<dyn OAuthVault>>, public_url: Option<&str>) -> OAuthClient {
        let base = public_url.map(|url| url.trim_end_matches('/'));
        OAuthClient {
            vault,
            callback_url: base.map(|base| Arc::from(format!("{base}{CALLBACK_PATH}"))),
            sign_in_page: base.map(|base| Arc::from(format!("{base}{SIGN_IN_PATH}"))),
        }
    }

    /// The gateway's sign-in page for the sign-in whose authorization URL is
    /// `authorize_url`: the page signs the person in and checks they are the
    /// caller the sign-in is for before sending them on.
    pub fn sign_in_page(&self, authorize_url: &str) -> Option<String> {
        let page = self.sign_in_page.as_deref()?;
        let state = state_of(authorize_url)?;
        let mut url = reqwest::Url::parse(page).ok()?;
        url.query_pairs_mut().append_pair("state", &state);
        Some(url.into())
    }

    pub fn vault(&self) -> Option<&Arc<dyn OAuthVault>> {
        self.vault.as_ref()
    }

    pub fn callback_url(&self) -> Option<&str> {
        self.callback_url.as_deref()
    }

    fn require_vault(&self) -> Result<&Arc<dyn OAuthVault>, String> {
        self.vault
            .as_ref()
            .ok_or_else(|| "no OAuth vault in this process".to_string())
    }
}

/// rmcp's credential store over the vault, for one server and principal.
pub struct VaultCredentials {
    vault: Arc<dyn OAuthVault>,
    server: String,
    principal: String,
}

impl VaultCredentials {
    pub fn new(vault: Arc<dyn OAuthVault>, server: &str, principal: &str) -> VaultCredentials {
        VaultCredentials {
            vault,
            server: server.to_string(),
            principal: principal.to_string(),
        }
    }
}

fn store_error(error: String) -> AuthError {
    AuthError::CredentialStoreError(error)
}

#[async_trait]
impl CredentialStore for VaultCredentials {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        let Some(plain) = self
            .vault
            .load(&self.server, &self.principal)
            .await
            .map_err(store_error)?
        else {
            return Ok(None);
        };
        serde_json::from_slice(&plain)
            .map(Some)
            .map_err(|e| store_error(format!("stored OAuth credentials unreadable: {e}")))
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        let plain = serde_json::to_vec(&credentials).map_err(|e| store_error(e.to_string()))?;
        self.vault
            .save(&self.server, &self.principal, plain)
            .await
            .map_err(store_error)
    }

    async fn clear(&self) -> Result<(), AuthError> {
        self.vault
            .clear(&self.server, &self.principal)
            .await
            .map_err(store_error)
    }

    async fn on_refresh_token_rejected(
        &self,
        _credentials: &StoredCredentials,
    ) -> Result<(), AuthError> {
        tracing::warn!(server = %self.server, "the authorization server refused the refresh token; sign in again with `manifold auth login`");
        Ok(())
    }

    async fn acquire_refresh_guard(&self) -> Result<Option<CredentialRefreshGuard>, AuthError> {
        let guard = self
            .vault
            .lease(&self.server, &self.principal)
            .await
            .map_err(store_error)?;
        Ok(Some(CredentialRefreshGuard::new(guard)))
    }
}

/// rmcp's PKCE state store over the vault: a sign-in started on one replica
/// can finish on another.
pub struct VaultStates {
    vault: Arc<dyn OAuthVault>,
    server: String,
    principal: String,
}

#[async_trait]
impl StateStore for VaultStates {
    async fn save(
        &self,
        csrf_token: &str,
        state: StoredAuthorizationState,
    ) -> Result<(), AuthError> {
        let plain = serde_json::to_vec(&state).map_err(|e| store_error(e.to_string()))?;
        self.vault
            .save_pending(csrf_token, &self.server, &self.principal, plain)
            .await
            .map_err(store_error)
    }

    async fn load(&self, csrf_token: &str) -> Result<Option<StoredAuthorizationState>, AuthError> {
        match self
            .vault
            .load_pending(csrf_token)
            .await
            .map_err(store_error)?
        {
            Some((server, principal, plain))
                if server == self.server && principal == self.principal =>
            {
                serde_json::from_slice(&plain)
                    .map(Some)
                    .map_err(|e| store_error(e.to_string()))
            }
            _ => Ok(None),
        }
    }

    async fn delete(&self, csrf_token: &str) -> Result<(), AuthError> {
        self.vault
            .delete_pending(csrf_token)
            .await
            .map_err(store_error)
    }
}

/// The client a server's sign-in registered, as kept in the vault.
#[derive(serde::Serialize, serde::Deserialize)]
struct KeptClient {
    client_id: String,
    client_secret: Option<String>,
    redirect_uri: String,
}

impl KeptClient {
    fn into_config(self) -> OAuthClientConfig {
        let client = OAuthClientConfig::new(self.client_id, self.redirect_uri);
        match self.client_secret {
            Some(secret) => client.with_client_secret(secret),
            None => client,
        }
    }
}

impl OAuthClient {
    /// Starts a sign-in to `config`'s server for `principal` (`""`: the
    /// server's shared credentials) whose callback is `redirect_uri`: the
    /// client is configured (pre-registered) or registered, and kept with the
    /// PKCE state in the vault. Returns the URL the person must open.
    pub async fn begin_sign_in(
        &self,
        config: &UpstreamConfig,
        principal: &str,
        redirect_uri: &str,
    ) -> Result<(AuthorizationManager, String), String> {
        let vault = self.require_vault()?;
        let mut manager = manager(config, Arc::clone(vault), principal)
            .await
            .map_err(|e| format!("OAuth discovery for {}: {e}", config.name))?;
        // A client registered earlier for this callback is reused: sign-ins of
        // several principals can be under way at once, and each finishes with
        // the client the server keeps.
        let registered = vault
            .load_client(&config.name)
            .await?
            .and_then(|plain| serde_json::from_slice::<KeptClient>(&plain).ok())
            .filter(|kept| kept.redirect_uri == redirect_uri)
            .map(KeptClient::into_config);
        let client = match (preregistered_client(config, redirect_uri)?, registered) {
            (Some(client), _) | (None, Some(client)) => client,
            (None, None) => manager
                .register_client("Manifold gateway", redirect_uri, &[])
                .await
                .map_err(|e| format!("dynamic client registration: {e}"))?,
        };
        let kept = KeptClient {
            client_id: client.client_id.clone(),
            client_secret: client.client_secret.clone(),
            redirect_uri: redirect_uri.to_string(),
        };
        vault
            .save_client(
                &config.name,
                serde_json::to_vec(&kept).map_err(|e| e.to_string())?,
            )
            .await?;
        manager
            .configure_client(client)
            .map_err(|e| format!("OAuth client: {e}"))?;
        let defaults: Vec<&str> = config.scopes.iter().map(String::as_str).collect();
        let scopes = manager.select_initial_scopes(&defaults).await;
        let scopes: Vec<&str> = scopes.iter().map(String::as_str).collect();
        let url = manager
            .get_authorization_url(&scopes)
            .await
            .map_err(|e| format!("authorization URL: {e}"))?;
        let state = state_of(&url).ok_or("the authorization URL carries no state")?;
        vault.link_pending(&state, &url).await?;
        Ok((manager, url))
    }

    /// Finishes the sign-in whose callback carried `state`, `code` and `iss`,
    /// on whichever replica got it: the server and principal come from the
    /// vault, the server's config from `config_of`. Returns the server's name
    /// and the principal that signed in (`""`: the server's shared
    /// credentials).
    pub async fn finish_sign_in(
        &self,
        config_of: impl Fn(&str) -> Option<UpstreamConfig>,
        state: &str,
        code: &str,
        issuer: Option<&str>,
    ) -> Result<(String, String), String> {
        let vault = self.require_vault()?;
        let (server, principal, _) = vault
            .load_pending(state)
            .await?
            .ok_or("this sign-in is unknown or has expired; start it again")?;
        let config = config_of(&server).ok_or_else(|| format!("no server '{server}'"))?;
        let kept: KeptClient = vault
            .load_client(&server)
            .await?
            .and_then(|plain| serde_json::from_slice(&plain).ok())
            .ok_or("the sign-in's client registration is gone; start it again")?;
        let mut manager = manager(&config, Arc::clone(vault), &principal)
            .await
            .map_err(|e| format!("OAuth discovery for {server}: {e}"))?;
        manager
            .configure_client(kept.into_config())
            .map_err(|e| format!("OAuth client: {e}"))?;
        manager
            .exchange_code_for_token_with_issuer(code, state, issuer)
            .await
            .map_err(|e| format!("exchanging the authorization code: {e}"))?;
        Ok((server, principal))
    }

    /// A manager ready to send requests for `config`'s server: signed in (the
    /// vault has its tokens) and its client configured. `Err` says how to sign
    /// in when it is not.
    pub async fn signed_in_manager(
        &self,
        config: &UpstreamConfig,
        principal: &str,
    ) -> Result<AuthorizationManager, String> {
        let vault = self.require_vault()?;
        let mut manager = manager(config, Arc::clone(vault), principal)
            .await
            .map_err(|e| format!("OAuth discovery: {e}"))?;
        let signed_in = manager
            .initialize_from_store()
            .await
            .map_err(|e| format!("OAuth credentials: {e}"))?;
        if !signed_in {
            return Err(sign_in_hint(&config.name));
        }
        // The stored client id is all rmcp keeps; a confidential client's
        // secret comes from the config.
        if let Some(client) = preregistered_client(config, "http://127.0.0.1/callback")? {
            manager
                .configure_client(client)
                .map_err(|e| format!("OAuth client: {e}"))?;
        }
        Ok(manager)
    }
}

/// The `state` parameter of an authorization URL: the key of its sign-in.
fn state_of(authorize_url: &str) -> Option<String> {
    reqwest::Url::parse(authorize_url)
        .ok()?
        .query_pairs()
        .find(|(name, _)| name == "state")
        .map(|(_, value)| value.into_owned())
}

/// Why an `oauth` server cannot be used yet.
pub fn sign_in_hint(server: &str) -> String {
    format!("needs sign-in: run `manifold auth login {server}` on the gateway's host")
}

/// An authorization manager for `config`'s server with its discovered
/// metadata and the vault's credentials for `principal`.
pub async fn manager(
    config: &UpstreamConfig,
    vault: Arc<dyn OAuthVault>,
    principal: &str,
) -> Result<AuthorizationManager, AuthError> {
    let url = config
        .url
        .as_deref()
        .ok_or_else(|| AuthError::InternalError("an oauth server needs a url".into()))?;
    // Loopback and private upstreams are configured on purpose by the
    // operator; their authorization servers may be too.
    let mut manager = AuthorizationManager::new_allowing_private_addresses(url).await?;
    // As the SDKs do: the server's own 401 says where its metadata is and
    // which scopes it wants; without one, the well-known places are tried.
    let challenge = challenge_of(url).await;
    let resolution = manager
        .resolve_metadata_from_challenge(challenge.as_deref())
        .await?;
    manager.set_metadata(resolution.metadata);
    manager.set_credential_store(VaultCredentials::new(
        Arc::clone(&vault),
        &config.name,
        principal,
    ));
    manager.set_state_store(VaultStates {
        vault,
        server: config.name.clone(),
        principal: principal.to_string(),
    });
    Ok(manager)
}

/// The `WWW-Authenticate` challenge `url` answers an unauthenticated
/// `initialize` with, if it answers 401 with one.
async fn challenge_of(url: &str) -> Option<String> {
    let http = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .ok()?;
    let response = http
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .json(&serde_json::json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "manifold", "version": env!("CARGO_PKG_VERSION")}}
        }))
        .send()
        .await
        .ok()?;
    if response.status() != reqwest::StatusCode::UNAUTHORIZED {
        return None;
    }
    response
        .headers()
        .get(reqwest::header::WWW_AUTHENTICATE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// The pre-registered client of `config`, if it names one.
pub fn preregistered_client(
    config: &UpstreamConfig,
    redirect_uri: &str,
) -> Result<Option<OAuthClientConfig>, String> {
    let Some(client_id) = &config.client_id else {
        return Ok(None);
    };
    let mut client = OAuthClientConfig::new(client_id.clone(), redirect_uri.to_string())
        .with_scopes(config.scopes.clone());
    if let Some(var) = &config.client_secret_env {
        let secret = std::env::var(var).map_err(|_| {
            format!(
                "server '{}': client_secret_env names {var}, which is not set",
                config.name
            )
        })?;
        client = client.with_client_secret(secret);
    }
    Ok(Some(client))
}
