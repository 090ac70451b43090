//! The gateway as an OAuth client of an upstream (`[[servers]] auth =
//! "oauth"`), on rmcp's `auth` client: discovery of the server's
//! protected-resource metadata and its authorization server, dynamic or
//! pre-registered clients, authorization code with PKCE, and refresh before
//! expiry and on a 401 (`AuthClient`).
//!
//! Tokens live in an [`OAuthVault`] the binary provides (the store, sealed),
//! so every replica uses them and a restart needs no new sign-in. A refresh
//! holds the vault's lease, so two replicas never spend one refresh token
//! twice (a provider that rotates refresh tokens revokes the grant when one
//! is reused).

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use rmcp::transport::auth::{
    AuthError, AuthorizationManager, CredentialRefreshGuard, CredentialStore, OAuthClientConfig,
    StoredCredentials,
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
}

static VAULT: OnceLock<Arc<dyn OAuthVault>> = OnceLock::new();

/// Installs the process's vault (once, at start). Without one, an `oauth`
/// server cannot connect.
pub fn install_vault(vault: Arc<dyn OAuthVault>) {
    let _ = VAULT.set(vault);
}

pub fn vault() -> Option<Arc<dyn OAuthVault>> {
    VAULT.get().cloned()
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
    manager.set_credential_store(VaultCredentials::new(vault, &config.name, principal));
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

/// A manager ready to send requests for `config`'s server: signed in (the
/// vault has its tokens) and its client configured. `Err` says how to sign
/// in when it is not.
pub async fn signed_in_manager(
    config: &UpstreamConfig,
    principal: &str,
) -> Result<AuthorizationManager, String> {
    let vault = vault().ok_or("no OAuth vault in this process")?;
    let mut manager = manager(config, vault, principal)
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
