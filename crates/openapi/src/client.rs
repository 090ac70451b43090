//! Sending requests and reading documents, each within a time and a size.
//!
//! One client per server, with no cookie store, so nothing one caller's
//! response sets reaches another's request, and no redirects followed: a
//! 3xx comes back as an error result rather than sending the operator's
//! credentials somewhere else.

use std::{
    io::Read,
    path::Path,
    time::{Duration, Instant},
};

use reqwest::Url;

use crate::{DocumentError, Limits, Outcome, PreparedRequest, outcome, read::too_large};

/// How much of an error response's body a result shows.
const ERROR_EXCERPT_CHARS: usize = 2000;

/// Why a call got no answer to turn into a result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("no answer within {timeout_ms} ms")]
    Timeout { timeout_ms: u64 },
    #[error("the response is larger than {limit} bytes")]
    TooLarge { bytes: usize, limit: usize },
    #[error("the request failed: {0}")]
    Transport(String),
}

#[derive(Debug, Clone)]
pub struct HttpClient {
    client: reqwest::Client,
}

impl HttpClient {
    pub fn new(connect_timeout: Duration) -> Result<Self, String> {
        Self::pinned(connect_timeout, &[])
    }

    /// A client that connects to each `(host, address)` pair's checked
    /// address instead of resolving the host again (which a rebinding name
    /// could answer differently).
    pub fn pinned(
        connect_timeout: Duration,
        pins: &[(String, std::net::SocketAddr)],
    ) -> Result<Self, String> {
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(connect_timeout)
            .pool_idle_timeout(Duration::from_secs(4));
        for (host, address) in pins {
            builder = builder.resolve(host, *address);
        }
        builder
            .build()
            .map(|client| Self { client })
            .map_err(|e| e.to_string())
    }

    /// Sends `request` and reads at most `max_bytes` of the answer, all
    /// within `timeout`.
    pub async fn send(
        &self,
        request: PreparedRequest,
        timeout: Duration,
        max_bytes: usize,
    ) -> Result<Outcome, CallError> {
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let exchange = async {
            let mut builder = self
                .client
                .request(request.method, request.url)
                .headers(request.headers);
            if let Some(body) = request.body {
                builder = builder.body(body);
            }
            let response = builder.send().await.map_err(transport)?;
            let status = response.status();
            let content_type = response
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let body = read_capped(response, max_bytes).await?;
            Ok(outcome(
                status,
                content_type.as_deref(),
                &body,
                ERROR_EXCERPT_CHARS,
            ))
        };
        tokio_timeout(timeout, exchange)
            .await
            .unwrap_or(Err(CallError::Timeout { timeout_ms }))
    }
}

/// An OAuth 2 client-credentials grant: the gateway's own token for an API,
/// fetched when first needed and kept until shortly before it expires.
pub struct ClientCredentials {
    token_url: Url,
    client_id: String,
    client_secret: String,
    scopes: Vec<String>,
    cached: tokio::sync::Mutex<Option<(String, Instant)>>,
}

/// A token is fetched again this long before the server says it expires.
const TOKEN_MARGIN: Duration = Duration::from_secs(30);
/// The most of a token response that is read.
const MAX_TOKEN_RESPONSE_BYTES: usize = 64 * 1024;

impl ClientCredentials {
    pub fn new(
        token_url: Url,
        client_id: String,
        client_secret: String,
        scopes: Vec<String>,
    ) -> Self {
        Self {
            token_url,
            client_id,
            client_secret,
            scopes,
            cached: tokio::sync::Mutex::new(None),
        }
    }

    /// Where the token is asked for.
    pub fn token_url(&self) -> &Url {
        &self.token_url
    }

    /// The current token, fetched within `timeout` when there is none or it
    /// is about to expire. Concurrent callers share one fetch.
    pub async fn token(&self, client: &HttpClient, timeout: Duration) -> Result<String, String> {
        let mut cached = self.cached.lock().await;
        if let Some((token, until)) = cached.as_ref()
            && Instant::now() < *until
        {
            return Ok(token.clone());
        }
        let mut form = Url::parse("form:").expect("a URL");
        form.query_pairs_mut()
            .append_pair("grant_type", "client_credentials");
        if !self.scopes.is_empty() {
            form.query_pairs_mut()
                .append_pair("scope", &self.scopes.join(" "));
        }
        let body = form.query().unwrap_or_default().to_string();
        let fetch = async {
            let response = client
                .client
                .post(self.token_url.clone())
                .basic_auth(&self.client_id, Some(&self.client_secret))
                .header(
                    http::header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded",
                )
                .header(http::header::ACCEPT, "application/json")
                .body(body)
                .send()
                .await
                .map_err(|e| transport(e).to_string())?;
            let status = response.status();
            let bytes = read_capped(response, MAX_TOKEN_RESPONSE_BYTES)
                .await
                .map_err(|e| e.to_string())?;
            if !status.is_success() {
                return Err(format!("the token endpoint answered HTTP {status}"));
            }
            let answer: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|_| "the token endpoint's answer is not JSON".to_string())?;
            let token = answer
                .get("access_token")
                .and_then(serde_json::Value::as_str)
                .ok_or("the token endpoint's answer has no access_token")?;
            let lifetime = answer
                .get("expires_in")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(3600);
            Ok((token.to_string(), Duration::from_secs(lifetime)))
        };
        let (token, lifetime) = tokio_timeout(timeout, fetch)
            .await
            .unwrap_or_else(|| Err("the token endpoint did not answer in time".into()))?;
        let until = Instant::now() + lifetime.saturating_sub(TOKEN_MARGIN);
        *cached = Some((token.clone(), until));
        Ok(token)
    }

    /// Drops the kept token (the API refused it): the next call fetches one.
    pub async fn forget(&self) {
        *self.cached.lock().await = None;
    }
}

/// Fetches a document from `url`: `https`, or `http` to this host only.
pub async fn fetch_document(
    client: &HttpClient,
    url: &str,
    limits: &Limits,
    timeout: Duration,
) -> Result<Vec<u8>, DocumentError> {
    let parsed = Url::parse(url).map_err(|e| DocumentError::new(url, format!("not a URL: {e}")))?;
    let loopback = parsed.host_str().is_some_and(|host| {
        host == "localhost"
            || host
                .trim_matches(['[', ']'])
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    });
    if parsed.scheme() != "https" && !(parsed.scheme() == "http" && loopback) {
        return Err(DocumentError::new(
            url,
            "a document is fetched over https (or http from this host only)",
        ));
    }
    let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    let fetch = async {
        let response = client
            .client
            .get(parsed)
            .header(
                http::header::ACCEPT,
                "application/json, application/yaml;q=0.9, */*;q=0.8",
            )
            .send()
            .await
            .map_err(|e| DocumentError::new(url, transport(e).to_string()))?;
        if !response.status().is_success() {
            return Err(DocumentError::new(
                url,
                format!("fetching it answered HTTP {}", response.status()),
            ));
        }
        read_capped(response, limits.max_document_bytes)
            .await
            .map_err(|e| match e {
                CallError::TooLarge { .. } => too_large(url, limits),
                other => DocumentError::new(url, other.to_string()),
            })
    };
    tokio_timeout(timeout, fetch).await.unwrap_or_else(|| {
        Err(DocumentError::new(
            url,
            format!("no answer within {timeout_ms} ms"),
        ))
    })
}

/// Reads a document file, refusing it once it passes the size limit.
pub fn read_document_file(path: &Path, limits: &Limits) -> Result<Vec<u8>, DocumentError> {
    let place = path.display().to_string();
    let file = std::fs::File::open(path)
        .map_err(|e| DocumentError::new(&place, format!("cannot open it: {e}")))?;
    let mut bytes = Vec::new();
    let cap = u64::try_from(limits.max_document_bytes).unwrap_or(u64::MAX);
    file.take(cap.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| DocumentError::new(&place, format!("cannot read it: {e}")))?;
    if bytes.len() > limits.max_document_bytes {
        return Err(too_large(&place, limits));
    }
    Ok(bytes)
}

async fn read_capped(
    mut response: reqwest::Response,
    max_bytes: usize,
) -> Result<Vec<u8>, CallError> {
    if let Some(length) = response.content_length()
        && usize::try_from(length).unwrap_or(usize::MAX) > max_bytes
    {
        return Err(CallError::TooLarge {
            bytes: usize::try_from(length).unwrap_or(usize::MAX),
            limit: max_bytes,
        });
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport)? {
        if body.len() + chunk.len() > max_bytes {
            return Err(CallError::TooLarge {
                bytes: body.len() + chunk.len(),
                limit: max_bytes,
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn transport(error: reqwest::Error) -> CallError {
    // The URL may carry an API key in its query: never in a message.
    let error = error.without_url();
    // Without its source chain reqwest says only "error sending request".
    let mut message = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    CallError::Transport(message)
}

/// `work`, or `None` when `timeout` passes first.
async fn tokio_timeout<T>(timeout: Duration, work: impl Future<Output = T>) -> Option<T> {
    tokio::time::timeout(timeout, work).await.ok()
}
