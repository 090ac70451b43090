//! An OpenAPI server: its document is read on connect, its operations are
//! the tools it lists, and a call is one HTTP request. It has no MCP
//! session, so it declares tools only; everything above the upstream (the
//! catalog, search, the broker) treats it as any other server.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex as StdMutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use http::{HeaderMap, HeaderName, HeaderValue};
use manifold_openapi::{
    Api, CallError, ClientCredentials, HttpClient, Limits, Selection, Target, Tier,
};
use rmcp::model::{
    CallToolResult, ContentBlock, JsonObject, ServerCapabilities, Tool, ToolAnnotations,
};

use super::open::Connection;
use crate::{
    CacheScope, ServerOrigin, ToolListing, UpstreamConfig, UpstreamError,
    address::{self, SystemResolver},
    expand_env,
};

/// The qualified name's limit (`server__tool`), as the catalog keeps it.
const MAX_QUALIFIED_LEN: usize = 64;

/// A server's document once read: its operations, their tools, and where
/// requests go.
struct Loaded {
    api: Api,
    tools: Vec<Tool>,
    target: Target,
    client: HttpClient,
    /// `auth = "oauth_client_credentials"`: the gateway's token.
    grant: Option<ClientCredentials>,
    read_at: Instant,
}

#[derive(Default)]
pub(super) struct OpenApi {
    loaded: StdMutex<Option<Arc<Loaded>>>,
    /// The next listing reads the document again (its file changed).
    expired: AtomicBool,
    /// Bumped by each disconnect: a file's watcher belongs to one
    /// connection and ends with it.
    generation: AtomicU64,
}

impl OpenApi {
    pub(super) fn is_loaded(&self) -> bool {
        self.loaded.lock().expect("openapi lock").is_some()
    }

    /// Forgets the document: the next connect reads it again.
    pub(super) fn unload(&self) {
        *self.loaded.lock().expect("openapi lock") = None;
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// The next listing reads the document again, whatever its age.
    pub(super) fn expire(&self) {
        self.expired.store(true, Ordering::SeqCst);
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// The document's file, when it is one (watched like the config).
    pub(super) fn document_file(config: &UpstreamConfig) -> Option<PathBuf> {
        let document = config.openapi.as_deref()?;
        let is_url = document.starts_with("https://") || document.starts_with("http://");
        (!is_url).then(|| PathBuf::from(document))
    }

    pub(super) fn capabilities() -> ServerCapabilities {
        let mut capabilities = ServerCapabilities::default();
        capabilities.tools = Some(rmcp::model::ToolsCapability::default());
        capabilities
    }

    /// Reads the document and makes its tools, within `connect_timeout_ms`.
    /// True when the tools differ from the ones it replaces (or there
    /// were none).
    pub(super) async fn load(&self, config: &UpstreamConfig) -> Result<bool, UpstreamError> {
        let connect_err = |reason: String| UpstreamError::Connect {
            server: config.name.clone(),
            reason,
        };
        let document = config.openapi.clone().unwrap_or_default();
        let limits = Limits {
            max_tool_name_len: MAX_QUALIFIED_LEN.saturating_sub(config.name.len() + 2),
            ..Limits::default()
        };
        let timeout = Duration::from_millis(config.connect_timeout_ms);
        let is_url = document.starts_with("https://") || document.starts_with("http://");
        let runtime = config.origin == ServerOrigin::Runtime;
        if runtime && !is_url {
            return Err(connect_err(
                "a server added at run time names its OpenAPI document by URL, not a file on the gateway's host".into(),
            ));
        }
        let mut pins = Vec::new();
        if runtime {
            pins.push(
                checked_address(config, &document)
                    .await
                    .map_err(connect_err)?,
            );
        }
        let client = HttpClient::pinned(timeout, &pins).map_err(connect_err)?;
        let bytes = if is_url {
            manifold_openapi::fetch_document(&client, &document, &limits, timeout)
                .await
                .map_err(|e| connect_err(e.to_string()))?
        } else {
            let path = document.clone();
            tokio::task::spawn_blocking(move || {
                manifold_openapi::read_document_file(Path::new(&path), &limits)
            })
            .await
            .map_err(|e| connect_err(e.to_string()))?
            .map_err(|e| connect_err(e.to_string()))?
        };
        let place = document.clone();
        let selection = Selection {
            include: config.include.clone(),
            exclude: config.exclude.clone(),
        };
        let api = tokio::task::spawn_blocking(move || {
            Api::parse_selected(&bytes, &place, &limits, &selection)
        })
        .await
        .map_err(|e| connect_err(e.to_string()))?
        .map_err(|e| connect_err(e.to_string()))?;
        for skipped in &api.skipped {
            tracing::warn!(server = %config.name, operation = %skipped.operation, reason = %skipped.reason, "OpenAPI operation left out");
        }
        let target =
            target(config, &api, is_url.then_some(document.as_str())).map_err(connect_err)?;
        let grant = grant(config, &api, &target).map_err(connect_err)?;
        // Where calls go is checked like a runtime server's address when the
        // server was added at run time, or when a fetched document, not the
        // operator, sent them to another origin than its own.
        let named_by_document = is_url
            && config.base_url.is_none()
            && reqwest::Url::parse(&document).ok().map(|d| d.origin())
                != Some(target.base.origin());
        let client = if runtime || named_by_document {
            let mut urls = vec![target.base.clone()];
            urls.extend(grant.as_ref().map(|g| g.token_url().clone()));
            for url in urls {
                pins.push(
                    checked_address(config, url.as_str())
                        .await
                        .map_err(connect_err)?,
                );
            }
            HttpClient::pinned(timeout, &pins).map_err(connect_err)?
        } else {
            client
        };
        let tools: Vec<Tool> = api.operations.iter().map(|op| tool(&op.tool)).collect();
        let loaded = Arc::new(Loaded {
            api,
            tools,
            target,
            client,
            grant,
            read_at: Instant::now(),
        });
        // Compared with what it replaces under the lock: of two reads at
        // once (the watcher's and a listing's), only one says "changed".
        let previous = self
            .loaded
            .lock()
            .expect("openapi lock")
            .replace(Arc::clone(&loaded));
        Ok(previous.is_none_or(|previous| previous.tools != loaded.tools))
    }

    /// The document's tools, as one page that anyone may share, and
    /// whether they changed. A document read longer ago than the server's
    /// `default_ttl_ms` is read again first; if that fails, the error goes
    /// to the catalog (which serves the last listing, marked stale) and the
    /// calls keep the operations they had.
    pub(super) async fn list_tools(
        &self,
        config: &UpstreamConfig,
    ) -> Result<(ToolListing, bool), UpstreamError> {
        let mut loaded = self.current(config)?;
        let mut changed = false;
        let expired = self.expired.swap(false, Ordering::SeqCst);
        if expired || loaded.read_at.elapsed() >= Duration::from_millis(config.default_ttl_ms) {
            changed = self.load(config).await?;
            loaded = self.current(config)?;
        }
        let listing = ToolListing {
            items: loaded.tools.clone(),
            ttl_ms: None,
            scope: CacheScope::Public,
            pages: 1,
        };
        Ok((listing, changed))
    }

    #[allow(clippy::result_large_err)] // the error every request returns
    fn current(&self, config: &UpstreamConfig) -> Result<Arc<Loaded>, UpstreamError> {
        self.loaded
            .lock()
            .expect("openapi lock")
            .clone()
            .ok_or_else(|| UpstreamError::NotConnected {
                server: config.name.clone(),
            })
    }

    /// One call: the operation's request, holding a concurrency permit,
    /// within `call_timeout_ms`, its answer read up to `max_result_bytes`.
    pub(super) async fn call(
        &self,
        connection: &Connection,
        tool: &str,
        arguments: Option<JsonObject>,
    ) -> Result<CallToolResult, UpstreamError> {
        let config = &connection.config;
        let loaded = self.current(config)?;
        let Some(operation) = loaded.api.operation(tool) else {
            return Err(UpstreamError::Rpc {
                server: config.name.clone(),
                error: rmcp::ErrorData::invalid_params(format!("unknown tool: {tool}"), None),
            });
        };
        let request = match operation.prepare(&loaded.target, &arguments.unwrap_or_default()) {
            Ok(request) => request,
            Err(reason) => {
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "invalid arguments: {reason}"
                ))]));
            }
        };
        // The wait for a permit counts against the call's time, as it does
        // for an MCP server's.
        let timeout = Duration::from_millis(config.call_timeout_ms);
        let started = Instant::now();
        let sent = match tokio::time::timeout(timeout, connection.calls.acquire()).await {
            Ok(permit) => {
                let _permit = permit.expect("semaphore never closed");
                send(&loaded, config, request, timeout, started).await
            }
            Err(_) => Err(CallError::Timeout {
                timeout_ms: config.call_timeout_ms,
            }),
        };
        let outcome = sent.map_err(|error| {
            let error = match error {
                CallError::Timeout { .. } => UpstreamError::Timeout {
                    server: config.name.clone(),
                    operation: "tools/call",
                    timeout_ms: config.call_timeout_ms,
                },
                CallError::TooLarge { bytes, limit } => UpstreamError::ResultTooLarge {
                    server: config.name.clone(),
                    bytes,
                    limit,
                },
                CallError::Transport(message) => UpstreamError::Protocol {
                    server: config.name.clone(),
                    message: format!("tools/call failed: {message}"),
                },
            };
            connection.record_error("tools/call", &error);
            error
        })?;
        let content = vec![ContentBlock::text(outcome.text)];
        let mut result = if outcome.is_error {
            CallToolResult::error(content)
        } else {
            CallToolResult::success(content)
        };
        result.structured_content = outcome.structured.map(serde_json::Value::Object);
        Ok(result)
    }
}

/// Sends `request` within what is left of `timeout`, with the grant's
/// token when the server has one; a 401 drops that token and the request
/// goes once more with a new one.
async fn send(
    loaded: &Loaded,
    config: &UpstreamConfig,
    mut request: manifold_openapi::PreparedRequest,
    timeout: Duration,
    started: Instant,
) -> Result<manifold_openapi::Outcome, CallError> {
    let left = || timeout.saturating_sub(started.elapsed());
    let Some(grant) = &loaded.grant else {
        return loaded
            .client
            .send(request, left(), config.max_result_bytes)
            .await;
    };
    let mut retried = false;
    loop {
        let token = grant
            .token(&loaded.client, left())
            .await
            .map_err(|e| CallError::Transport(format!("cannot get a token: {e}")))?;
        let bearer = HeaderValue::try_from(format!("Bearer {token}"))
            .map_err(|_| CallError::Transport("the token is not a header value".into()))?;
        request.headers.insert(http::header::AUTHORIZATION, bearer);
        let outcome = loaded
            .client
            .send(request.clone(), left(), config.max_result_bytes)
            .await?;
        if outcome.status != 401 || retried {
            return Ok(outcome);
        }
        grant.forget().await;
        retried = true;
    }
}

/// `url`'s host and the address it resolves to, checked as a runtime
/// server's (`[admin] allowed_hosts` may name private ones), to pin.
async fn checked_address(
    config: &UpstreamConfig,
    url: &str,
) -> Result<(String, std::net::SocketAddr), String> {
    let address = address::check_url(url, &config.allowed_private_hosts, &SystemResolver)
        .await
        .map_err(|e| e.to_string())?;
    let host = reqwest::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
        .ok_or_else(|| format!("{url:?} names no host"))?;
    Ok((host, address))
}

/// The client-credentials grant of an `oauth_client_credentials` server:
/// the document's token URL (relative to where requests go), the client,
/// its secret from the environment, and the scopes.
fn grant(
    config: &UpstreamConfig,
    api: &Api,
    target: &Target,
) -> Result<Option<ClientCredentials>, String> {
    if config.auth != Some(crate::UpstreamAuth::OauthClientCredentials) {
        return Ok(None);
    }
    let token_url = api
        .client_credentials_token_url
        .as_deref()
        .ok_or("the document declares no OAuth 2 client-credentials flow")?;
    let token_url = target
        .base
        .join(token_url)
        .map_err(|e| format!("token URL {token_url:?}: {e}"))?;
    let variable = config.client_secret_env.as_deref().unwrap_or_default();
    let secret = std::env::var(variable)
        .map_err(|_| format!("environment variable {variable} is not set"))?;
    Ok(Some(ClientCredentials::new(
        token_url,
        config.client_id.clone().unwrap_or_default(),
        secret,
        config.scopes.clone(),
    )))
}

/// Where requests go (`base_url`, else the document's first server, else
/// `/`; a relative one against the document's URL), with the operator's
/// headers and query parameters, secrets expanded.
fn target(
    config: &UpstreamConfig,
    api: &Api,
    document_url: Option<&str>,
) -> Result<Target, String> {
    // Messages show the URL as written: expanded, it may hold a secret.
    let (base, shown) = match &config.base_url {
        Some(base) => (expand_env(base)?, base.clone()),
        None => {
            let server = api.servers.first().cloned().unwrap_or_else(|| "/".into());
            (server.clone(), server)
        }
    };
    if base.contains('{') {
        return Err(format!(
            "the server URL {shown:?} has variables; set base_url to the URL to use"
        ));
    }
    let parsed = match (reqwest::Url::parse(&base), document_url) {
        (Ok(url), _) => url,
        (Err(_), Some(document)) => reqwest::Url::parse(document)
            .and_then(|document| document.join(&base))
            .map_err(|e| format!("base URL {shown:?}: {e}"))?,
        (Err(_), None) => {
            return Err(format!(
                "the server URL {shown:?} is not absolute; set base_url to where its requests go"
            ));
        }
    };
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("base URL {shown:?} is not http or https"));
    }
    let mut headers = HeaderMap::new();
    for (name, value) in &config.headers {
        let value = expand_env(value)?;
        let name = HeaderName::try_from(name.as_str())
            .map_err(|e| format!("bad header name {name:?}: {e}"))?;
        let value =
            HeaderValue::try_from(value).map_err(|_| format!("bad value for header {name:?}"))?;
        headers.insert(name, value);
    }
    let query = config
        .query
        .iter()
        .map(|(name, value)| Ok((name.clone(), expand_env(value)?)))
        .collect::<Result<_, String>>()?;
    Ok(Target {
        base: parsed,
        headers,
        query,
    })
}

/// The MCP tool of an operation; its annotations say what the method
/// implies.
fn tool(spec: &manifold_openapi::ToolSpec) -> Tool {
    let (read_only, destructive) = match spec.tier {
        Tier::ReadOnly => (true, false),
        Tier::Write => (false, false),
        Tier::Destructive => (false, true),
    };
    let mut annotations = match &spec.title {
        Some(title) => ToolAnnotations::with_title(title.clone()),
        None => ToolAnnotations::new(),
    };
    annotations = annotations
        .read_only(read_only)
        .destructive(destructive)
        .open_world(true);
    let mut tool = Tool::new(
        spec.name.clone(),
        spec.description.clone(),
        Arc::new(spec.input_schema.clone()),
    )
    .with_annotations(annotations);
    if let Some(title) = &spec.title {
        tool = tool.with_title(title.clone());
    }
    if let Some(output) = &spec.output_schema {
        tool = tool.with_raw_output_schema(Arc::new(output.clone()));
    }
    tool
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(servers: &[&str]) -> Api {
        let document = serde_json::json!({
            "openapi": "3.1.0",
            "servers": servers.iter().map(|url| serde_json::json!({ "url": url })).collect::<Vec<_>>(),
            "paths": {},
        });
        Api::parse(
            document.to_string().as_bytes(),
            "t.json",
            &Limits::default(),
        )
        .unwrap()
    }

    #[test]
    fn requests_go_to_base_url_else_the_documents_server_else_beside_it() {
        let mut config =
            UpstreamConfig::openapi("shop", "https://docs.example.com/v1/openapi.json");
        let url = |config: &UpstreamConfig, api: &Api, document: Option<&str>| {
            target(config, api, document).map(|t| t.base.to_string())
        };
        let document = Some("https://docs.example.com/v1/openapi.json");
        assert_eq!(
            url(&config, &api(&["https://api.example.com/v2"]), document).unwrap(),
            "https://api.example.com/v2"
        );
        assert_eq!(
            url(&config, &api(&["/api"]), document).unwrap(),
            "https://docs.example.com/api"
        );
        assert_eq!(
            url(&config, &api(&[]), document).unwrap(),
            "https://docs.example.com/"
        );
        let error = url(&config, &api(&["/api"]), None).unwrap_err();
        assert!(error.contains("set base_url"), "{error}");
        config.base_url = Some("https://override.example.com/".into());
        assert_eq!(
            url(&config, &api(&["https://api.example.com/v2"]), document).unwrap(),
            "https://override.example.com/"
        );
    }

    /// A one-operation document at `path`, its summary `summary`.
    fn write_pets(path: &Path, summary: &str) {
        let document = serde_json::json!({
            "openapi": "3.0.3",
            "paths": { "/pets": { "get": { "operationId": "listPets", "summary": summary } } },
        });
        std::fs::write(path, document.to_string()).unwrap();
    }

    /// A server of that document whose requests would go nowhere.
    fn pets_config(path: &Path) -> UpstreamConfig {
        let mut config = UpstreamConfig::openapi("pets", path.to_str().unwrap());
        config.base_url = Some("http://127.0.0.1:1/".into());
        config
    }

    /// The document is read again once the listing TTL has passed; a
    /// changed operation is a changed tool and `ToolsChanged` goes out, and
    /// a document that became unreadable is an error, not an empty list.
    #[tokio::test]
    async fn the_document_is_read_again_after_the_listing_ttl() {
        let path =
            std::env::temp_dir().join(format!("manifold-openapi-{}.json", std::process::id()));
        let write = |summary: &str| write_pets(&path, summary);
        write("List pets");
        let mut config = pets_config(&path);
        config.default_ttl_ms = 0;
        let (events, mut heard) = tokio::sync::mpsc::unbounded_channel();
        let upstream = crate::Upstream::new(config, events, Default::default());
        upstream.connect().await.unwrap();
        let description = |listing: &ToolListing| listing.items[0].description.clone().unwrap();
        assert_eq!(
            description(&upstream.list_tools().await.unwrap()),
            "List pets"
        );
        while heard.try_recv().is_ok() {}
        write("List every pet");
        assert_eq!(
            description(&upstream.list_tools().await.unwrap()),
            "List every pet"
        );
        let events: Vec<_> = std::iter::from_fn(|| heard.try_recv().ok()).collect();
        assert!(
            events.contains(&crate::UpstreamEvent::ToolsChanged {
                server: "pets".into()
            }),
            "{events:?}"
        );
        // Unchanged: nothing to hear.
        upstream.list_tools().await.unwrap();
        assert!(
            std::iter::from_fn(|| heard.try_recv().ok())
                .all(|e| !matches!(e, crate::UpstreamEvent::ToolsChanged { .. }))
        );
        std::fs::write(&path, "swagger: \"2.0\"").unwrap();
        let error = upstream.list_tools().await.unwrap_err().to_string();
        assert!(error.contains("Swagger 2.0"), "{error}");
        std::fs::remove_file(&path).unwrap();
    }

    /// With every permit taken, a call's wait for one is part of its
    /// time: it times out at `call_timeout_ms`, not after the call ahead.
    #[tokio::test]
    async fn waiting_for_a_permit_counts_against_the_call_timeout() {
        let router = axum::Router::new().route(
            "/slow",
            axum::routing::get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "late"
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        let path =
            std::env::temp_dir().join(format!("manifold-openapi-slow-{}.json", std::process::id()));
        let document = serde_json::json!({
            "openapi": "3.1.0",
            "servers": [{ "url": format!("http://{address}") }],
            "paths": { "/slow": { "get": { "operationId": "slow" } } },
        });
        std::fs::write(&path, document.to_string()).unwrap();
        let mut config = UpstreamConfig::openapi("slow", path.to_str().unwrap());
        config.max_concurrency = 1;
        config.call_timeout_ms = 400;
        let (events, _heard) = tokio::sync::mpsc::unbounded_channel();
        let upstream = crate::Upstream::new(config, events, Default::default());
        upstream.connect().await.unwrap();
        std::fs::remove_file(&path).unwrap();
        let context = crate::CallContext::default();
        let started = Instant::now();
        let (first, second) = tokio::join!(
            upstream.call_tool_with("slow", None, &context),
            upstream.call_tool_with("slow", None, &context),
        );
        for result in [first, second] {
            assert!(matches!(
                result,
                Err(UpstreamError::Timeout {
                    timeout_ms: 400,
                    ..
                })
            ));
        }
        assert!(
            started.elapsed() < Duration::from_millis(750),
            "{:?}",
            started.elapsed()
        );
    }

    /// `oauth_client_credentials`: the document's token URL gives the
    /// gateway a token for its calls; one the API refuses is replaced once.
    #[tokio::test]
    async fn a_client_credentials_server_calls_with_its_token_and_renews_a_refused_one() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let issued = Arc::new(AtomicU32::new(0));
        let counter = Arc::clone(&issued);
        let router = axum::Router::new()
            .route(
                "/oauth/token",
                axum::routing::post(move || {
                    let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    async move {
                        axum::Json(serde_json::json!({ "access_token": format!("t{n}"), "expires_in": 3600 }))
                    }
                }),
            )
            .route(
                "/pets",
                axum::routing::get(|headers: http::HeaderMap| async move {
                    // The first token is "revoked".
                    match headers.get("authorization").and_then(|v| v.to_str().ok()) {
                        Some("Bearer t2") => (http::StatusCode::OK, "pets"),
                        _ => (http::StatusCode::UNAUTHORIZED, "no"),
                    }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        let path =
            std::env::temp_dir().join(format!("manifold-openapi-cc-{}.json", std::process::id()));
        let document = serde_json::json!({
            "openapi": "3.1.0",
            "servers": [{ "url": format!("http://{address}") }],
            "paths": { "/pets": { "get": { "operationId": "pets" } } },
            "components": { "securitySchemes": { "oauth": { "type": "oauth2", "flows": {
                "clientCredentials": { "tokenUrl": "/oauth/token", "scopes": {} } } } } },
        });
        std::fs::write(&path, document.to_string()).unwrap();
        // SAFETY: single-threaded set-up of a unique variable.
        unsafe { std::env::set_var("MANIFOLD_TEST_CC_SECRET", "s3cret") };
        let mut config = UpstreamConfig::openapi("cc", path.to_str().unwrap());
        config.auth = Some(crate::UpstreamAuth::OauthClientCredentials);
        config.client_id = Some("gateway".into());
        config.client_secret_env = Some("MANIFOLD_TEST_CC_SECRET".into());
        config.validate().unwrap();
        let (events, _heard) = tokio::sync::mpsc::unbounded_channel();
        let upstream = crate::Upstream::new(config, events, Default::default());
        upstream.connect().await.unwrap();
        std::fs::remove_file(&path).unwrap();
        let context = crate::CallContext::default();
        for _ in 0..2 {
            let rmcp::model::CallToolResponse::Complete(result) = upstream
                .call_tool_with("pets", None, &context)
                .await
                .unwrap()
            else {
                panic!("not a complete result");
            };
            assert_eq!(result.is_error, Some(false), "{result:?}");
        }
        assert_eq!(issued.load(Ordering::SeqCst), 2);
    }

    /// A document file is watched like the config: a change is read at
    /// once, not after the listing TTL, and callers hear `list_changed`.
    #[tokio::test]
    async fn a_changed_document_file_is_read_again_and_announced() {
        let path = std::env::temp_dir().join(format!(
            "manifold-openapi-watch-{}.json",
            std::process::id()
        ));
        let write = |summary: &str| write_pets(&path, summary);
        write("List pets");
        let config = pets_config(&path);
        let (events, mut heard) = tokio::sync::mpsc::unbounded_channel();
        let upstream = crate::Upstream::new(config, events, Default::default());
        upstream.connect().await.unwrap();
        let description = |listing: &ToolListing| listing.items[0].description.clone().unwrap();
        assert_eq!(
            description(&upstream.list_tools().await.unwrap()),
            "List pets"
        );
        while heard.try_recv().is_ok() {}
        write("List every pet, by owner");
        let announced = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(crate::UpstreamEvent::ToolsChanged { .. }) = heard.recv().await {
                    return;
                }
            }
        })
        .await;
        assert!(announced.is_ok(), "no list_changed within 10 s");
        assert_eq!(
            description(&upstream.list_tools().await.unwrap()),
            "List every pet, by owner"
        );
        upstream.disconnect().await;
        std::fs::remove_file(&path).unwrap();
    }

    /// A server added at run time, and the address a fetched document
    /// sends calls to, get the runtime-server address checks; the
    /// operator's own choices do not.
    #[tokio::test]
    async fn runtime_servers_and_what_a_fetched_document_names_are_address_checked() {
        let document = serde_json::json!({
            "openapi": "3.1.0",
            "servers": [{ "url": "http://10.1.2.3/api" }],
            "paths": { "/pets": { "get": { "operationId": "pets" } } },
        });
        let router = axum::Router::new().route(
            "/openapi.json",
            axum::routing::get(move || {
                let document = document.clone();
                async move { axum::Json(document) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        let url = format!("http://{address}/openapi.json");
        let connect = |config: UpstreamConfig| async move {
            let (events, _heard) = tokio::sync::mpsc::unbounded_channel();
            let upstream = crate::Upstream::new(config, events, Default::default());
            upstream
                .connect()
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        let runtime = |document: &str| {
            let mut config = UpstreamConfig::openapi("shop", document);
            config.origin = ServerOrigin::Runtime;
            config
        };

        let error = connect(runtime("/etc/passwd")).await.unwrap_err();
        assert!(error.contains("by URL, not a file"), "{error}");
        let error = connect(runtime(&url)).await.unwrap_err();
        assert!(error.contains("loopback, private or link-local"), "{error}");
        // The operator's document may send calls only where its own host is,
        // unless the operator names the place.
        let error = connect(UpstreamConfig::openapi("shop", &url))
            .await
            .unwrap_err();
        assert!(
            error.contains("10.1.2.3") && error.contains("allowed_hosts"),
            "{error}"
        );
        let mut named = UpstreamConfig::openapi("shop", &url);
        named.base_url = Some("http://10.1.2.3/api".into());
        connect(named).await.unwrap();
        let mut allowed = runtime(&url);
        allowed.allowed_private_hosts = vec!["127.0.0.1".into()];
        allowed.base_url = Some(format!("http://{address}/"));
        connect(allowed).await.unwrap();
    }

    /// A secret in base_url never shows in the message of a bad one.
    #[test]
    fn a_bad_base_url_is_shown_as_written() {
        // SAFETY: single-threaded test setting a unique variable.
        unsafe { std::env::set_var("MANIFOLD_TEST_OPENAPI_KEY", "hunter2") };
        let mut config = UpstreamConfig::openapi("shop", "shop.yaml");
        config.base_url = Some("ftp://api.example.com/?key=${MANIFOLD_TEST_OPENAPI_KEY}".into());
        let error = target(&config, &api(&[]), None).unwrap_err();
        assert!(error.contains("${MANIFOLD_TEST_OPENAPI_KEY}"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
    }
}
