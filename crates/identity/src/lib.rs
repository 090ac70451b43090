//! Who a caller is when it signs in with the company's identity provider.
//!
//! The gateway is an OAuth 2.1 resource server: a caller sends an access
//! token (a JWT, RFC 9068) that the provider issued for the gateway's
//! resource URL (RFC 8707). [`AccessTokenVerifier`] checks it against the
//! provider's published keys and turns its claims into a [`Verified`]
//! identity. What the identity may do is the broker's business.
//!
//! The provider's metadata (OpenID discovery, else RFC 8414) names its JWKS.
//! Keys are cached, re-read every `jwks_refresh`, and re-read at once for a
//! token signed with a key the cache does not know (a rotation), at most
//! once per [`UNKNOWN_KEY_REFETCH`] so that made-up key ids cannot turn each
//! request into a fetch. A key the provider no longer publishes stops
//! verifying tokens as soon as the cache is re-read.

mod claims;

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use jsonwebtoken::{
    Algorithm, DecodingKey, Validation, decode, decode_header,
    errors::ErrorKind,
    jwk::{Jwk, PublicKeyUse},
};
use serde_json::{Map, Value};

pub use claims::Verified;

/// How often a token with an unknown key id may cause a JWKS fetch.
pub const UNKNOWN_KEY_REFETCH: Duration = Duration::from_secs(2);
/// The largest metadata or JWKS document read from the provider.
const MAX_DOCUMENT_BYTES: usize = 1 << 20;

/// What `[auth.oidc]` says about the provider and its tokens.
#[derive(Debug, Clone)]
pub struct OidcSettings {
    /// The provider's issuer URL, exactly as its tokens' `iss` carries it.
    pub issuer: String,
    /// The audience every token must name: the gateway's `resource_url`.
    pub audience: String,
    /// The claim that names the user (`sub` by default).
    pub principal_claim: String,
    /// The claim that lists the user's groups, if any.
    pub groups_claim: Option<String>,
    /// Signature algorithms accepted. Symmetric ones are never accepted:
    /// the gateway holds no secret shared with the provider.
    pub algorithms: Vec<Algorithm>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
    /// How long fetched keys are used before they are read again.
    pub jwks_refresh: Duration,
}

impl OidcSettings {
    /// The settings for `issuer` and `audience` with the defaults.
    pub fn new(issuer: impl Into<String>, audience: impl Into<String>) -> OidcSettings {
        OidcSettings {
            issuer: issuer.into(),
            audience: audience.into(),
            principal_claim: "sub".into(),
            groups_claim: Some("groups".into()),
            algorithms: DEFAULT_ALGORITHMS.to_vec(),
            leeway: Duration::from_secs(60),
            jwks_refresh: Duration::from_secs(300),
        }
    }
}

/// Asymmetric algorithms the verifier accepts unless configured otherwise.
pub const DEFAULT_ALGORITHMS: [Algorithm; 8] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
];

/// Parses an algorithm name from the config (`RS256`, `ES256`, `EdDSA`...);
/// HMAC names are refused.
pub fn parse_algorithm(name: &str) -> Result<Algorithm, String> {
    let alg: Algorithm = name
        .parse()
        .map_err(|_| format!("unknown JWT algorithm {name:?}"))?;
    if matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) {
        return Err(format!(
            "{name} is symmetric: the gateway shares no secret with the provider"
        ));
    }
    Ok(alg)
}

/// Why an access token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("malformed token")]
    Malformed,
    #[error("expired")]
    Expired,
    #[error("not yet valid")]
    NotYetValid,
    #[error("issued for another audience")]
    WrongAudience,
    #[error("issued by another issuer")]
    WrongIssuer,
    #[error("bad signature")]
    BadSignature,
    #[error("signed with a key the provider does not publish")]
    UnknownKey,
    #[error("algorithm {0} not allowed")]
    Algorithm(String),
    #[error("token type {0:?} is not an access token")]
    WrongType(String),
    #[error("claim {0} missing or malformed")]
    Claim(String),
    /// The provider's keys could not be had: not the token's fault.
    #[error("identity provider unavailable: {0}")]
    Unavailable(String),
}

/// Verifies access tokens from one provider; share one per gateway.
pub struct AccessTokenVerifier {
    settings: OidcSettings,
    http: reqwest::Client,
    keys: RwLock<Arc<KeySet>>,
    /// One fetch at a time; the others wait for its result.
    fetching: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct KeySet {
    jwks_uri: Option<String>,
    by_id: HashMap<String, Arc<Key>>,
    /// Keys without a `kid`, tried for tokens without one.
    unnamed: Vec<Arc<Key>>,
    fetched_at: Option<Instant>,
}

struct Key {
    key: DecodingKey,
    /// The JWK's `alg`, when it names one: a token must use exactly that.
    alg: Option<Algorithm>,
}

impl std::fmt::Debug for AccessTokenVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessTokenVerifier")
            .field("issuer", &self.settings.issuer)
            .field("audience", &self.settings.audience)
            .finish()
    }
}

impl AccessTokenVerifier {
    pub fn new(settings: OidcSettings) -> Result<AccessTokenVerifier, String> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        Ok(AccessTokenVerifier {
            settings,
            http,
            keys: RwLock::new(Arc::default()),
            fetching: tokio::sync::Mutex::new(()),
        })
    }

    pub fn settings(&self) -> &OidcSettings {
        &self.settings
    }

    /// Reads the provider's metadata and keys now (at start), so the first
    /// caller does not wait; a failure is logged and retried on demand.
    pub async fn prefetch(&self) {
        if let Err(error) = self.refetch(None).await {
            tracing::warn!(issuer = %self.settings.issuer, %error, "identity provider keys not loaded yet");
        }
    }

    /// Verifies `token` and returns who it names.
    pub async fn verify(&self, token: &str) -> Result<Verified, Rejected> {
        let header = decode_header(token).map_err(|_| Rejected::Malformed)?;
        if !self.settings.algorithms.contains(&header.alg) {
            return Err(Rejected::Algorithm(format!("{:?}", header.alg)));
        }
        if let Some(typ) = &header.typ {
            // RFC 9068 says `at+jwt`; many providers still write `JWT`.
            let typ_lower = typ.to_ascii_lowercase();
            if !matches!(typ_lower.as_str(), "at+jwt" | "application/at+jwt" | "jwt") {
                return Err(Rejected::WrongType(typ.clone()));
            }
        }
        let key = self.key_for(header.kid.as_deref()).await?;
        if key.alg.is_some_and(|alg| alg != header.alg) {
            return Err(Rejected::Algorithm(format!("{:?}", header.alg)));
        }
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.settings.leeway.as_secs();
        validation.validate_nbf = true;
        validation.set_audience(&[&self.settings.audience]);
        validation.set_issuer(&[&self.settings.issuer]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let data =
            decode::<Map<String, Value>>(token, &key.key, &validation).map_err(|e| {
                match e.kind() {
                    ErrorKind::ExpiredSignature => Rejected::Expired,
                    ErrorKind::ImmatureSignature => Rejected::NotYetValid,
                    ErrorKind::InvalidAudience => Rejected::WrongAudience,
                    ErrorKind::InvalidIssuer => Rejected::WrongIssuer,
                    ErrorKind::InvalidSignature => Rejected::BadSignature,
                    ErrorKind::InvalidAlgorithm => Rejected::Algorithm(format!("{:?}", header.alg)),
                    ErrorKind::MissingRequiredClaim(claim)
                    | ErrorKind::InvalidClaimFormat(claim) => Rejected::Claim(claim.clone()),
                    _ => Rejected::Malformed,
                }
            })?;
        claims::read(&self.settings, &data.claims)
    }

    /// The key a token names, reading the provider's keys again when they
    /// are stale or do not have it.
    async fn key_for(&self, kid: Option<&str>) -> Result<Arc<Key>, Rejected> {
        let current = self.current();
        let stale = current
            .fetched_at
            .is_none_or(|at| at.elapsed() >= self.settings.jwks_refresh);
        let set = if stale {
            match self.refetch(current.fetched_at).await {
                Ok(set) => set,
                // Keys that worked a moment ago keep working while the
                // provider is briefly away.
                Err(_) if current.fetched_at.is_some() => current,
                Err(error) => return Err(Rejected::Unavailable(error)),
            }
        } else {
            current
        };
        if let Some(key) = set.find(kid) {
            return Ok(key);
        }
        let may_refetch = set
            .fetched_at
            .is_none_or(|at| at.elapsed() >= UNKNOWN_KEY_REFETCH);
        if may_refetch && let Ok(set) = self.refetch(set.fetched_at).await {
            return set.find(kid).ok_or(Rejected::UnknownKey);
        }
        Err(Rejected::UnknownKey)
    }

    fn current(&self) -> Arc<KeySet> {
        Arc::clone(&self.keys.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Fetches the keys unless another fetch finished since `seen` (the
    /// `fetched_at` the caller saw), and returns the newest set.
    async fn refetch(&self, seen: Option<Instant>) -> Result<Arc<KeySet>, String> {
        let _one = self.fetching.lock().await;
        let current = self.current();
        if current.fetched_at.is_some() && current.fetched_at != seen {
            return Ok(current);
        }
        let jwks_uri = match &current.jwks_uri {
            Some(uri) => uri.clone(),
            None => self.discover().await?,
        };
        let document = self.get_json(&jwks_uri).await?;
        let set = Arc::new(KeySet::from_jwks(jwks_uri, &document)?);
        tracing::debug!(issuer = %self.settings.issuer, keys = set.by_id.len() + set.unnamed.len(), "identity provider keys read");
        *self.keys.write().unwrap_or_else(|p| p.into_inner()) = Arc::clone(&set);
        Ok(set)
    }

    /// The provider's `jwks_uri`, from OpenID discovery or RFC 8414
    /// metadata, whose `issuer` must be the configured one.
    async fn discover(&self) -> Result<String, String> {
        let issuer = self.settings.issuer.trim_end_matches('/');
        let mut errors = Vec::new();
        for url in metadata_urls(issuer) {
            match self.get_json(&url).await {
                Ok(metadata) => {
                    if metadata.get("issuer").and_then(Value::as_str) != Some(&self.settings.issuer)
                    {
                        return Err(format!(
                            "{url} names issuer {:?}, not {:?}",
                            metadata.get("issuer"),
                            self.settings.issuer
                        ));
                    }
                    return metadata
                        .get("jwks_uri")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .ok_or_else(|| format!("{url} has no jwks_uri"));
                }
                Err(error) => errors.push(error),
            }
        }
        Err(errors.join("; "))
    }

    async fn get_json(&self, url: &str) -> Result<Value, String> {
        let mut response = self
            .http
            .get(url)
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("GET {url}: HTTP {}", response.status()));
        }
        if response
            .content_length()
            .is_some_and(|n| n > MAX_DOCUMENT_BYTES as u64)
        {
            return Err(format!("GET {url}: document too large"));
        }
        // Read chunk by chunk: a chunked response has no length to check
        // first, and must not be buffered whole before it is refused.
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?
        {
            if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
                return Err(format!("GET {url}: document too large"));
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&body).map_err(|e| format!("GET {url}: not JSON: {e}"))
    }
}

/// Where the metadata of `issuer` may be: OpenID discovery, then RFC 8414
/// (with the issuer's path after the well-known part).
fn metadata_urls(issuer: &str) -> Vec<String> {
    let mut urls = vec![format!("{issuer}/.well-known/openid-configuration")];
    let after_scheme = issuer.find("://").map_or(0, |i| i + 3);
    match issuer[after_scheme..].find('/') {
        Some(slash) => {
            let (origin, path) = issuer.split_at(after_scheme + slash);
            urls.push(format!(
                "{origin}/.well-known/oauth-authorization-server{path}"
            ));
        }
        None => urls.push(format!("{issuer}/.well-known/oauth-authorization-server")),
    }
    urls
}

impl KeySet {
    /// The signing keys of a JWKS document; keys that are not for
    /// signatures or that cannot be read are skipped, not fatal.
    fn from_jwks(jwks_uri: String, document: &Value) -> Result<KeySet, String> {
        let keys = document
            .get("keys")
            .and_then(Value::as_array)
            .ok_or("the JWKS has no keys array")?;
        let mut set = KeySet {
            jwks_uri: Some(jwks_uri),
            fetched_at: Some(Instant::now()),
            ..KeySet::default()
        };
        for value in keys {
            let Ok(jwk) = serde_json::from_value::<Jwk>(value.clone()) else {
                continue;
            };
            if jwk
                .common
                .public_key_use
                .as_ref()
                .is_some_and(|u| *u != PublicKeyUse::Signature)
            {
                continue;
            }
            let Ok(key) = DecodingKey::from_jwk(&jwk) else {
                continue;
            };
            let alg = jwk
                .common
                .key_algorithm
                .and_then(|a| Algorithm::try_from(a).ok());
            let key = Arc::new(Key { key, alg });
            match jwk.common.key_id {
                Some(kid) => {
                    set.by_id.insert(kid, key);
                }
                None => set.unnamed.push(key),
            }
        }
        Ok(set)
    }

    fn find(&self, kid: Option<&str>) -> Option<Arc<Key>> {
        match kid {
            Some(kid) => self.by_id.get(kid).cloned(),
            // A token without a kid: only unambiguous when there is one key.
            None => match (self.unnamed.as_slice(), self.by_id.len()) {
                ([only], 0) => Some(Arc::clone(only)),
                ([], 1) => self.by_id.values().next().cloned(),
                _ => None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_looked_for_where_both_rfcs_put_it() {
        assert_eq!(
            metadata_urls("https://id.example"),
            [
                "https://id.example/.well-known/openid-configuration",
                "https://id.example/.well-known/oauth-authorization-server"
            ]
        );
        assert_eq!(
            metadata_urls("https://id.example/tenant/a"),
            [
                "https://id.example/tenant/a/.well-known/openid-configuration",
                "https://id.example/.well-known/oauth-authorization-server/tenant/a"
            ]
        );
    }

    /// Serves one HTTP/1.1 response of endless chunks, without a
    /// Content-Length, and returns how many body bytes it managed to send.
    async fn serve_endless_chunks(listener: tokio::net::TcpListener) -> usize {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = [0u8; 4096];
        let _ = socket.read(&mut request).await.unwrap();
        socket
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
            .await
            .unwrap();
        let chunk = vec![b' '; 64 * 1024];
        let mut sent = 0;
        loop {
            let head = format!("{:x}\r\n", chunk.len());
            let wrote = async {
                socket.write_all(head.as_bytes()).await?;
                socket.write_all(&chunk).await?;
                socket.write_all(b"\r\n").await
            };
            if wrote.await.is_err() {
                return sent;
            }
            sent += chunk.len();
        }
    }

    #[tokio::test]
    async fn a_chunked_document_is_refused_once_it_passes_the_cap() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_endless_chunks(listener));
        let verifier =
            AccessTokenVerifier::new(OidcSettings::new(format!("http://{address}"), "aud"))
                .unwrap();
        // An endless body can only end by the reader stopping: a reader that
        // buffers before checking runs into its timeout instead.
        let error = verifier
            .get_json(&format!("http://{address}/jwks"))
            .await
            .unwrap_err();
        assert!(error.ends_with("document too large"), "{error}");
        drop(verifier);
        let sent = tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the reader closed the connection")
            .unwrap();
        assert!(sent > MAX_DOCUMENT_BYTES, "sent {sent}");
    }

    #[tokio::test]
    async fn a_chunked_discovery_document_is_refused_once_it_passes_the_cap() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_endless_chunks(listener));
        let verifier =
            AccessTokenVerifier::new(OidcSettings::new(format!("http://{address}"), "aud"))
                .unwrap();
        let error = verifier.discover().await.unwrap_err();
        assert!(
            error.contains("openid-configuration: document too large"),
            "{error}"
        );
        drop(verifier);
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the reader closed the connection")
            .unwrap();
    }

    #[test]
    fn symmetric_algorithms_are_refused() {
        assert_eq!(parse_algorithm("ES256"), Ok(Algorithm::ES256));
        assert!(parse_algorithm("HS256").unwrap_err().contains("symmetric"));
        assert!(parse_algorithm("none").is_err());
    }

    #[test]
    fn a_jwks_keeps_signing_keys_and_skips_what_it_cannot_read() {
        let document = serde_json::json!({"keys": [
            {"kty": "RSA", "kid": "a", "use": "sig", "alg": "RS256", "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw", "e": "AQAB"},
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": "sXch", "e": "AQAB"},
            {"kty": "weird", "kid": "w"},
        ]});
        let set = KeySet::from_jwks("u".into(), &document).unwrap();
        assert_eq!(set.by_id.len(), 1);
        assert!(
            set.find(Some("a"))
                .is_some_and(|k| k.alg == Some(Algorithm::RS256))
        );
        assert!(set.find(Some("enc")).is_none());
        // One key: a token without a kid may use it.
        assert!(set.find(None).is_some());
        assert!(KeySet::from_jwks("u".into(), &serde_json::json!({})).is_err());
    }
}
