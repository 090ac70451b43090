//! A `tools/call` to a stateless (2026-07-28) HTTP upstream as one POST.
//!
//! rmcp's client sends each request through its service loop and its
//! transport worker: several task hops, the message serialised twice more to
//! build headers, the URL parsed anew, and the reply read through rmcp's
//! untagged message enums, which buffer it and try each kind of result in
//! turn. To a stateless upstream a call is one POST whose reply carries the
//! result, so a call nobody relays for (no progress, logs or questions to
//! pass back) is posted here directly, on the same keep-alive client, and
//! its reply is read straight as rmcp's `CallToolResult` (or error); only a
//! reply of another kind is read again the general way. The message types
//! and the body limit stay rmcp's; the request is written from borrowed
//! parts in rmcp's layout. Everything else (listings, legacy upstreams,
//! stdio, relayed calls, OAuth servers) stays on rmcp.
//!
//! To a plain `http://` upstream with no proxy in the environment the POST
//! goes out on a keep-alive connection the call drives itself
//! ([`OwnConnections`]). reqwest's own layers (its redirect policy, a
//! URL parsed back from every reply, the proxy matcher) were 6% of the
//! gateway's CPU under load, and its pool's connection tasks cost thread
//! wake-ups. It resolves as reqwest did (the pinned address, else the
//! system), and a 307 or 308 reply is posted again through reqwest, which
//! follows it as rmcp's client would. HTTPS and proxied upstreams stay on
//! reqwest, with its TLS roots and proxy rules.

mod headers;
mod message;
mod own_connections;
mod reply;

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::atomic::{AtomicI64, Ordering},
};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use http_body_util::BodyExt;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientRequest, Implementation, JsonObject,
    NumberOrString, ProtocolVersion, RequestMetaObject, ServerResult,
};

pub(crate) use headers::ParamHeaderTools;
use headers::plain_header_value;
use message::{CallMessage, CallParams, MergedMeta};
use own_connections::OwnConnections;
use reply::{BoxError, ReplyBody, read_response};

use crate::{CallContext, UpstreamError};

const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");

/// Proxy settings reqwest reads for `http://` URLs; with any of them set,
/// calls stay on reqwest, which applies them.
const PROXY_VARIABLES: &[&str] = &["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"];

/// Connections of our own for `url` when they may stand in for reqwest's.
fn own_connections(url: &reqwest::Url, pinned: Option<SocketAddr>) -> Option<OwnConnections> {
    let proxied = PROXY_VARIABLES
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()));
    if proxied {
        return None;
    }
    OwnConnections::new(url, pinned)
}

/// What a direct POST to one connected stateless upstream needs.
pub(crate) struct PlainPost {
    http: reqwest::Client,
    /// Set for a plain `http://` upstream with no proxy.
    direct: Option<OwnConnections>,
    /// Parsed once: reqwest would parse a string on every request.
    url: reqwest::Url,
    /// The configured headers plus `MCP-Protocol-Version`, `Accept` and
    /// `Content-Type`.
    headers: HeaderMap,
    /// The `_meta` rmcp's peer would send with every request (version,
    /// client info and capabilities), made once: serialising the last two
    /// anew was a tenth of a call's serialising.
    fixed_meta: RequestMetaObject,
    /// Ids for direct POSTs, apart from rmcp's (negative, so they never meet).
    next_id: AtomicI64,
}

impl PlainPost {
    pub(crate) fn new(
        http: reqwest::Client,
        uri: &str,
        pinned: Option<SocketAddr>,
        configured: HashMap<HeaderName, HeaderValue>,
        protocol_version: ProtocolVersion,
        client_info: Implementation,
        client_capabilities: ClientCapabilities,
    ) -> Option<Self> {
        let mut headers: HeaderMap = configured.into_iter().collect();
        headers.insert(
            PROTOCOL_VERSION,
            HeaderValue::from_str(protocol_version.as_str()).ok()?,
        );
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream, application/json"),
        );
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let url = reqwest::Url::parse(uri).ok()?;
        let direct = own_connections(&url, pinned);
        let mut fixed_meta = RequestMetaObject::default();
        fixed_meta.set_protocol_version(protocol_version);
        fixed_meta.set_client_info(client_info);
        fixed_meta.set_client_capabilities(client_capabilities);
        Some(Self {
            http,
            direct,
            url,
            headers,
            fixed_meta,
            next_id: AtomicI64::new(-1),
        })
    }

    /// The `Mcp-Name` of `request` if this path may send it: a plain
    /// `tools/call` of a tool without parameter headers, for a caller nobody
    /// relays to.
    pub(crate) fn takes(
        &self,
        request: &ClientRequest,
        context: &CallContext,
        param_header_tools: &ParamHeaderTools,
    ) -> Option<HeaderValue> {
        let ClientRequest::CallToolRequest(call) = request else {
            return None;
        };
        if context.relay.is_some() || param_header_tools.contains(&call.params.name) {
            return None;
        }
        plain_header_value(&call.params.name)
    }

    /// The call's JSON-RPC message. Its `_meta` is what rmcp's peer would
    /// send: version, client info and capabilities, then the caller's own.
    fn call_body(
        &self,
        params: &CallToolRequestParams,
        id: &NumberOrString,
        context: &CallContext,
        traceparent: Option<&str>,
    ) -> serde_json::Result<Vec<u8>> {
        let none = JsonObject::new();
        let call_meta = context.modern_meta();
        serde_json::to_vec(&CallMessage {
            jsonrpc: "2.0",
            id,
            method: "tools/call",
            params: CallParams {
                meta: MergedMeta {
                    layers: [
                        params.meta.as_ref().map_or(&none, |meta| &meta.0.0),
                        &self.fixed_meta.0.0,
                        &call_meta.0.0,
                    ],
                    traceparent,
                },
                name: &params.name,
                arguments: params.arguments.as_ref(),
                input_responses: params.input_responses.as_ref(),
                request_state: params.request_state.as_deref(),
            },
        })
    }

    /// One POST on reqwest, for upstreams our own connections do not
    /// reach and for the second POST after a redirect.
    async fn post_on_reqwest(
        &self,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<http::Response<ReplyBody>, BoxError> {
        let response = self
            .http
            .post(self.url.clone())
            .headers(headers)
            .body(body)
            .send()
            .await?;
        Ok(http::Response::from(response).map(|body| body.map_err(BoxError::from).boxed()))
    }

    /// Posts `request` and waits for its result. `name`: from [`Self::takes`].
    pub(crate) async fn send(
        &self,
        server: &str,
        request: ClientRequest,
        name: HeaderValue,
        context: &CallContext,
        traceparent: Option<&str>,
    ) -> Result<ServerResult, UpstreamError> {
        let protocol = |message: String| UpstreamError::Protocol {
            server: server.to_string(),
            message: format!("tools/call failed: {message}"),
        };
        let ClientRequest::CallToolRequest(call) = &request else {
            return Err(protocol("not a tools/call".into()));
        };
        // Built again only for a redirect, which goes out a second time.
        let headers = || {
            let mut headers = self.headers.clone();
            headers.insert(MCP_METHOD, HeaderValue::from_static("tools/call"));
            headers.insert(MCP_NAME, name.clone());
            if let Some(value) = traceparent.and_then(|t| HeaderValue::from_str(t).ok()) {
                headers.insert(TRACEPARENT, value);
            }
            headers
        };
        let id = NumberOrString::Number(self.next_id.fetch_sub(1, Ordering::Relaxed));
        let body = self
            .call_body(&call.params, &id, context, traceparent)
            .map_err(|e| protocol(e.to_string()))?;
        // Not held across the POST.
        drop(request);
        let body = Bytes::from(body);
        let id = &id;
        let reply = match &self.direct {
            Some(own) => own
                .post(headers(), body.clone(), |response| async move {
                    // A redirect is posted again, through reqwest.
                    let moved = matches!(
                        response.status(),
                        StatusCode::TEMPORARY_REDIRECT | StatusCode::PERMANENT_REDIRECT
                    );
                    if moved {
                        None
                    } else {
                        Some(read_response(response, id).await)
                    }
                })
                .await
                .map_err(|e| protocol(e.to_string()))?,
            None => None,
        };
        let reply = match reply {
            Some(reply) => reply,
            None => {
                let response = self
                    .post_on_reqwest(headers(), body)
                    .await
                    .map_err(|e| protocol(e.to_string()))?;
                read_response(response, id).await
            }
        };
        reply
            .map_err(protocol)?
            .map_err(|error| UpstreamError::Rpc {
                server: server.to_string(),
                error,
            })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use serde_json::{Value, json};

    /// What the test peer saw: the paths asked for, in order, and the
    /// connections it accepted.
    #[derive(Default)]
    struct Seen {
        paths: std::sync::Mutex<Vec<String>>,
        bodies: std::sync::Mutex<Vec<Value>>,
        connections: std::sync::atomic::AtomicUsize,
    }

    /// An HTTP/1.1 peer on loopback: `POST /old` is redirected (307) to
    /// `/new`, which answers each call with a text result naming the path.
    /// With `one_reply`, it closes each connection after its first reply.
    async fn redirecting_upstream(one_reply: bool) -> (SocketAddr, std::sync::Arc<Seen>) {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let paths = std::sync::Arc::new(Seen::default());
        let seen = std::sync::Arc::clone(&paths);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                seen.connections.fetch_add(1, Ordering::SeqCst);
                let seen = std::sync::Arc::clone(&seen);
                tokio::spawn(async move {
                    let mut stream = BufReader::new(stream);
                    loop {
                        let mut line = String::new();
                        if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let path = line.split(' ').nth(1).unwrap_or_default().to_string();
                        let mut length = 0;
                        loop {
                            let mut header = String::new();
                            stream.read_line(&mut header).await.unwrap();
                            if header.trim().is_empty() {
                                break;
                            }
                            if let Some((name, value)) = header.split_once(':')
                                && name.eq_ignore_ascii_case("content-length")
                            {
                                length = value.trim().parse().unwrap();
                            }
                        }
                        let mut body = vec![0; length];
                        stream.read_exact(&mut body).await.unwrap();
                        seen.paths.lock().unwrap().push(path.clone());
                        if let Ok(body) = serde_json::from_slice(&body) {
                            seen.bodies.lock().unwrap().push(body);
                        }
                        let reply = if path == "/old" {
                            "HTTP/1.1 307 Temporary Redirect\r\nlocation: /new\r\ncontent-length: 0\r\n\r\n".to_string()
                        } else {
                            let id = serde_json::from_slice::<Value>(&body).unwrap()["id"].clone();
                            let json = json!({"jsonrpc": "2.0", "id": id,
                                "result": {"content": [{"type": "text", "text": path}]}})
                            .to_string();
                            format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{json}",
                                json.len()
                            )
                        };
                        stream.get_mut().write_all(reply.as_bytes()).await.unwrap();
                        if one_reply {
                            return;
                        }
                    }
                });
            }
        });
        (address, paths)
    }

    fn plain_post(url: &str, pinned: Option<SocketAddr>) -> PlainPost {
        let reqwest = reqwest::Client::builder()
            .redirect(crate::trace::same_origin_redirects())
            .build()
            .unwrap();
        PlainPost::new(
            reqwest,
            url,
            pinned,
            HashMap::new(),
            ProtocolVersion::V_2026_07_28,
            Implementation::new("test", "0"),
            ClientCapabilities::default(),
        )
        .unwrap()
    }

    async fn call_text(post: &PlainPost) -> String {
        let request = ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(
            rmcp::model::CallToolRequestParams::new("echo"),
        ));
        let name = HeaderValue::from_static("echo");
        match post
            .send("up", request, name, &CallContext::default(), None)
            .await
        {
            Ok(ServerResult::CallToolResult(result)) => {
                result.content[0].as_text().unwrap().text.clone()
            }
            other => panic!("{other:?}"),
        }
    }

    /// A plain `http://` upstream is posted to on hyper's client, which
    /// connects to the pinned address whatever the name resolves to, and a
    /// redirect is followed through reqwest as rmcp's client would.
    #[tokio::test]
    async fn the_direct_client_keeps_the_pin_and_follows_same_origin_redirects() {
        if !no_proxy() {
            return;
        }
        let (address, seen) = redirecting_upstream(false).await;
        let port = address.port();
        // A name that resolves nowhere: only the pin reaches the peer.
        let pinned = plain_post(
            &format!("http://upstream.invalid:{port}/new"),
            Some(address),
        );
        assert!(pinned.direct.is_some(), "an http:// upstream goes direct");
        assert_eq!(call_text(&pinned).await, "/new");
        let redirected = plain_post(&format!("http://127.0.0.1:{port}/old"), None);
        assert_eq!(call_text(&redirected).await, "/new");
        assert_eq!(
            *seen.paths.lock().unwrap(),
            ["/new", "/old", "/old", "/new"]
        );
        // HTTPS stays on reqwest (its TLS roots).
        assert!(plain_post("https://example.com/mcp", None).direct.is_none());
    }

    fn no_proxy() -> bool {
        let set = PROXY_VARIABLES
            .iter()
            .any(|name| std::env::var_os(name).is_some());
        if set {
            eprintln!("a proxy is set: calls go through reqwest; nothing to test here");
        }
        !set
    }

    /// Every call's `_meta` is what rmcp's peer would send: version, client
    /// info and capabilities, in that order, each call alike.
    #[tokio::test]
    async fn each_call_carries_the_meta_rmcp_would_send() {
        if !no_proxy() {
            return;
        }
        let (address, seen) = redirecting_upstream(false).await;
        let post = plain_post(&format!("http://{address}/new"), None);
        for _ in 0..2 {
            assert_eq!(call_text(&post).await, "/new");
        }
        let mut expected = RequestMetaObject::default();
        expected.set_protocol_version(ProtocolVersion::V_2026_07_28);
        expected.set_client_info(Implementation::new("test", "0"));
        expected.set_client_capabilities(ClientCapabilities::default());
        let expected = serde_json::to_value(&expected).unwrap();
        let bodies = seen.bodies.lock().unwrap();
        assert_eq!(bodies.len(), 2);
        for body in bodies.iter() {
            let meta = &body["params"]["_meta"];
            assert_eq!(meta, &expected);
            let keys: Vec<&String> = meta.as_object().unwrap().keys().collect();
            let order: Vec<&String> = expected.as_object().unwrap().keys().collect();
            assert_eq!(keys, order);
        }
    }

    /// The message written from borrowed parts is the one rmcp would
    /// send for the same call, `_meta` keys in the same order: with a
    /// `_meta` of the request's own, a caller whose capabilities and log
    /// level override the fixed ones, trace context, and an MRTR retry.
    #[test]
    #[allow(deprecated)] // The log level (SEP-2577) still travels in `_meta`.
    fn the_message_is_the_one_rmcp_would_send() {
        use rmcp::model::{CallToolRequest, ClientJsonRpcMessage, GetMeta, LoggingLevel};
        let post = plain_post("http://127.0.0.1:1/mcp", None);
        let mut params = CallToolRequestParams::new("echo");
        params.arguments = Some(
            json!({ "message": "hi", "_meta": { "x": 1 } })
                .as_object()
                .unwrap()
                .clone(),
        );
        params.input_responses = Some([("q1".to_string(), json!({ "answer": 42 }))].into());
        params.request_state = Some("opaque".into());
        let mut own = RequestMetaObject::default();
        own.0.0.insert("progressToken".into(), json!(7));
        own.set_log_level(LoggingLevel::Debug);
        params.meta = Some(own);
        let mut capabilities = ClientCapabilities::default();
        capabilities.experimental = Some([("x".to_string(), JsonObject::new())].into());
        let context = CallContext {
            client_capabilities: Some(capabilities),
            log_level: Some(LoggingLevel::Warning),
            ..CallContext::default()
        };
        let id = NumberOrString::Number(-3);
        for traceparent in [
            None,
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        ] {
            let ours: Value = serde_json::from_slice(
                &post.call_body(&params, &id, &context, traceparent).unwrap(),
            )
            .unwrap();
            let mut request = ClientRequest::CallToolRequest(CallToolRequest::new(params.clone()));
            let meta = request.get_meta_mut();
            meta.extend(post.fixed_meta.clone());
            meta.extend(context.modern_meta());
            if let Some(traceparent) = traceparent {
                meta.0.set_traceparent(traceparent.to_string());
            }
            let rmcps =
                serde_json::to_value(ClientJsonRpcMessage::request(request, id.clone())).unwrap();
            assert_eq!(ours, rmcps);
            let keys = |v: &Value| {
                v["params"]["_meta"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
            };
            assert_eq!(keys(&ours), keys(&rmcps));
            assert_eq!(
                ours["params"]["_meta"]["io.modelcontextprotocol/logLevel"],
                "warning"
            );
        }
    }

    /// Calls one after another share one connection; calls at once each
    /// get one, and all of them are kept for the calls after.
    #[tokio::test]
    async fn calls_keep_their_connections_alive() {
        if !no_proxy() {
            return;
        }
        let (address, seen) = redirecting_upstream(false).await;
        let post = std::sync::Arc::new(plain_post(&format!("http://{address}/new"), None));
        for _ in 0..20 {
            assert_eq!(call_text(&post).await, "/new");
        }
        assert_eq!(seen.connections.load(Ordering::SeqCst), 1);
        let at_once = |n| {
            futures::future::join_all((0..n).map(|_| {
                let post = std::sync::Arc::clone(&post);
                async move { call_text(&post).await }
            }))
        };
        assert!(at_once(8).await.iter().all(|text| text == "/new"));
        let opened = seen.connections.load(Ordering::SeqCst);
        assert!((2..=8).contains(&opened), "{opened} connections");
        for _ in 0..5 {
            assert!(at_once(opened).await.iter().all(|text| text == "/new"));
        }
        assert_eq!(seen.connections.load(Ordering::SeqCst), opened);
    }

    /// An upstream that closes each connection after one reply: every call
    /// still succeeds, each on a new connection, never failing on the
    /// closed one it left idle.
    #[tokio::test]
    async fn a_connection_the_upstream_closed_is_not_used_again() {
        if !no_proxy() {
            return;
        }
        let (address, seen) = redirecting_upstream(true).await;
        let post = plain_post(&format!("http://{address}/new"), None);
        for round in 1..=5 {
            assert_eq!(call_text(&post).await, "/new");
            // Give the close time to arrive before the next call.
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(seen.connections.load(Ordering::SeqCst), round);
        }
    }
}
