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
//! ([`crate::own_connection`]). reqwest's own layers (its redirect policy, a
//! URL parsed back from every reply, the proxy matcher) were 6% of the
//! gateway's CPU under load, and its pool's connection tasks cost thread
//! wake-ups. It resolves as reqwest did (the pinned address, else the
//! system), and a 307 or 308 reply is posted again through reqwest, which
//! follows it as rmcp's client would. HTTPS and proxied upstreams stay on
//! reqwest, with its TLS roots and proxy rules.

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    sync::{
        RwLock,
        atomic::{AtomicI64, Ordering},
    },
};

use bytes::Bytes;
use http_body_util::{BodyDataStream, BodyExt, combinators::BoxBody};

use futures::StreamExt;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientRequest, ErrorData,
    Implementation, InputResponses, JsonObject, NumberOrString, ProtocolVersion, RequestMetaObject,
    ServerJsonRpcMessage, ServerResult, Tool,
};
use serde::Deserialize;
use serde_json::Value;

use crate::{CallContext, UpstreamError, own_connection::OwnConnections};

const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");

/// The most a reply may hold, JSON or the whole event stream: rmcp's own
/// default for a JSON reply. `max_result_bytes` then applies to the result.
const MAX_REPLY_BYTES: usize = 16 * 1024 * 1024;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A reply's body, from either client.
pub(crate) type ReplyBody = BoxBody<Bytes, BoxError>;

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

/// Tools whose input schema asks for `Mcp-Param-*` headers (SEP-2243
/// `x-mcp-header`): rmcp builds those, so their calls stay on rmcp. Names
/// are only added: listings cached per caller may each show a different
/// part of the server, and none of them may take a name off.
#[derive(Default)]
pub(crate) struct ParamHeaderTools(RwLock<HashSet<String>>);

impl ParamHeaderTools {
    pub(crate) fn learn(&self, tools: &[Tool]) {
        let mut annotated = tools
            .iter()
            .filter(|tool| names_param_headers(&tool.input_schema))
            .peekable();
        if annotated.peek().is_none() {
            return;
        }
        let mut names = self.0.write().unwrap_or_else(|p| p.into_inner());
        names.extend(annotated.map(|tool| tool.name.to_string()));
    }

    fn contains(&self, name: &str) -> bool {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(name)
    }
}

fn names_param_headers(schema: &JsonObject) -> bool {
    schema.iter().any(|(key, value)| {
        key == "x-mcp-header"
            || match value {
                Value::Object(map) => names_param_headers(map),
                Value::Array(items) => items
                    .iter()
                    .any(|item| item.as_object().is_some_and(names_param_headers)),
                _ => false,
            }
    })
}

/// A name that goes into `Mcp-Name` as it is: visible ASCII with no
/// surrounding blanks and nothing that looks like the Base64 form. Other
/// names are rmcp's to encode.
fn plain_header_value(name: &str) -> Option<HeaderValue> {
    let plain = !name.is_empty()
        && name.bytes().all(|b| (0x21..=0x7e).contains(&b))
        && !name.starts_with("=?");
    plain.then(|| HeaderValue::from_str(name).ok()).flatten()
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

/// A `tools/call` message as rmcp's `ClientJsonRpcMessage` serialises it,
/// written from borrowed parts: rmcp's path would clone the fixed `_meta`
/// into the request, merge maps, and go through serde's flattening. The
/// test `the_message_is_the_one_rmcp_would_send` holds the two equal.
#[derive(serde::Serialize)]
struct CallMessage<'a> {
    jsonrpc: &'static str,
    id: &'a NumberOrString,
    method: &'static str,
    params: CallParams<'a>,
}

/// rmcp's `CallToolRequestParams`, field for field.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct CallParams<'a> {
    #[serde(rename = "_meta")]
    meta: MergedMeta<'a>,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    arguments: Option<&'a JsonObject>,
    #[serde(skip_serializing_if = "Option::is_none")]
    input_responses: Option<&'a InputResponses>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_state: Option<&'a str>,
}

/// The maps `layers` merged as `extend` would merge them, in order, then
/// `traceparent` set: each key where it first appears, with the value of
/// the last layer that has it.
struct MergedMeta<'a> {
    layers: [&'a JsonObject; 3],
    traceparent: Option<&'a str>,
}

impl serde::Serialize for MergedMeta<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        const TRACEPARENT_KEY: &str = "traceparent";
        let mut map = serializer.serialize_map(None)?;
        let mut traced = false;
        for (n, layer) in self.layers.iter().enumerate() {
            for (key, value) in layer.iter() {
                if self.layers[..n]
                    .iter()
                    .any(|earlier| earlier.contains_key(key))
                {
                    continue;
                }
                match self.traceparent {
                    Some(traceparent) if key == TRACEPARENT_KEY => {
                        traced = true;
                        map.serialize_entry(key, traceparent)?;
                    }
                    _ => {
                        let last = self.layers[n + 1..]
                            .iter()
                            .rev()
                            .find_map(|later| later.get(key))
                            .unwrap_or(value);
                        map.serialize_entry(key, last)?;
                    }
                }
            }
        }
        if let (Some(traceparent), false) = (self.traceparent, traced) {
            map.serialize_entry(TRACEPARENT_KEY, traceparent)?;
        }
        map.end()
    }
}

/// This call's result or JSON-RPC error from `response`; the outer error
/// says why there is neither.
async fn read_response(
    response: http::Response<ReplyBody>,
    id: &NumberOrString,
) -> Result<Result<ServerResult, ErrorData>, String> {
    let status = response.status();
    let media = media_type(response.headers());
    if !status.is_success() {
        // A JSON-RPC error may come with any status; anything else is the
        // status alone.
        let error =
            match media {
                Media::Json => read_bounded(response)
                    .await
                    .ok()
                    .and_then(|body| match read_reply(&body, id) {
                        Some(Err(error)) => Some(error),
                        _ => None,
                    }),
                _ => None,
            };
        return error.map(Err).ok_or_else(|| format!("HTTP {status}"));
    }
    if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
        return Err("the upstream accepted the call without a result".into());
    }
    match media {
        Media::Json => {
            let body = read_bounded(response).await?;
            read_reply(&body, id).ok_or_else(|| "a reply that is not this call's result".into())
        }
        Media::EventStream => {
            read_event_stream(BodyDataStream::new(response.into_body()), id).await
        }
        Media::Other => Err(format!("a reply of an unexpected content type ({status})")),
    }
}

/// A reply's media type, as far as a call cares.
enum Media {
    Json,
    EventStream,
    Other,
}

fn media_type(headers: &HeaderMap) -> Media {
    let essence = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .map(str::trim)
        .unwrap_or_default();
    if essence.eq_ignore_ascii_case("application/json") {
        Media::Json
    } else if essence.eq_ignore_ascii_case("text/event-stream") {
        Media::EventStream
    } else {
        Media::Other
    }
}

/// This call's reply from an event stream read to [`MAX_REPLY_BYTES`] at
/// most: events without a message (priming, keep-alive) are skipped, and so
/// are progress and logs, which are for nobody here (a stateless upstream
/// asks nothing in-stream).
async fn read_event_stream<S, E>(
    stream: S,
    id: &NumberOrString,
) -> Result<Result<ServerResult, ErrorData>, String>
where
    S: futures::Stream<Item = Result<bytes::Bytes, E>>,
    E: Into<BoxError>,
{
    let mut read = 0usize;
    let bytes = stream.map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        read += chunk.len();
        if read > MAX_REPLY_BYTES {
            return Err(std::io::Error::other(too_large()));
        }
        Ok(chunk)
    });
    let mut events = std::pin::pin!(sse_stream::SseStream::from_bytes_stream(bytes));
    loop {
        let Some(event) = events.next().await else {
            return Err("the event stream ended before the result".into());
        };
        let event = event.map_err(|e| e.to_string())?;
        let Some(data) = event.data.filter(|d| !d.trim().is_empty()) else {
            continue;
        };
        if let Some(reply) = read_reply(data.as_bytes(), id) {
            return Ok(reply);
        }
    }
}

fn too_large() -> String {
    format!("the reply is over {MAX_REPLY_BYTES} bytes")
}

/// The whole body, refused past [`MAX_REPLY_BYTES`].
async fn read_bounded(response: http::Response<ReplyBody>) -> Result<Vec<u8>, String> {
    let announced = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok())
        .unwrap_or(0);
    if announced > MAX_REPLY_BYTES as u64 {
        return Err(too_large());
    }
    let mut reply = response.into_body();
    let mut body = Vec::with_capacity(announced as usize);
    while let Some(frame) = reply.frame().await {
        let Ok(chunk) = frame.map_err(|e| e.to_string())?.into_data() else {
            continue;
        };
        if body.len() + chunk.len() > MAX_REPLY_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A reply as a plain call's usually is: a `CallToolResult` or an error.
/// rmcp's `CallToolResult` refuses another `resultType`, so an
/// `input_required` or `task` result falls to the general reading.
#[derive(Deserialize)]
struct CallReply {
    id: Option<NumberOrString>,
    result: Option<CallToolResult>,
    error: Option<ErrorData>,
}

/// This call's result or error in one JSON-RPC message; `None` for a message
/// that is someone else's, or not a reply.
fn read_reply(message: &[u8], id: &NumberOrString) -> Option<Result<ServerResult, ErrorData>> {
    if let Ok(reply) = serde_json::from_slice::<CallReply>(message) {
        match reply {
            CallReply {
                id: Some(ref got),
                result: Some(result),
                error: None,
            } if got == id => return Some(Ok(ServerResult::CallToolResult(result))),
            CallReply {
                id: got,
                result: None,
                error: Some(error),
            } if got.as_ref().is_none_or(|got| got == id) => return Some(Err(error)),
            _ => {}
        }
    }
    match serde_json::from_slice::<ServerJsonRpcMessage>(message).ok()? {
        ServerJsonRpcMessage::Response(r) if r.id == *id => Some(Ok(r.result)),
        ServerJsonRpcMessage::Error(e) if e.id.as_ref().is_none_or(|got| got == id) => {
            Some(Err(e.error))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use serde_json::json;

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

    #[test]
    fn param_header_annotations_are_found_at_any_depth() {
        let plain = json!({"type": "object", "properties": {"q": {"type": "string"}}});
        let annotated = json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"}}});
        let in_a_list = json!({"type": "object", "anyOf": [
            {"properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}]});
        assert!(!names_param_headers(plain.as_object().unwrap()));
        assert!(names_param_headers(annotated.as_object().unwrap()));
        assert!(names_param_headers(in_a_list.as_object().unwrap()));
    }

    #[test]
    fn a_listing_without_an_annotated_tool_takes_no_name_off() {
        let tool = |name: &str, schema: Value| {
            Tool::new(
                name.to_string(),
                "",
                std::sync::Arc::new(schema.as_object().unwrap().clone()),
            )
        };
        let annotated = json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"}}});
        let tools = ParamHeaderTools::default();
        tools.learn(&[
            tool("routed", annotated),
            tool("plain", json!({"type": "object"})),
        ]);
        tools.learn(&[tool("plain", json!({"type": "object"}))]);
        assert!(tools.contains("routed"));
        assert!(!tools.contains("plain"));
    }

    #[test]
    fn a_reply_is_read_as_this_calls_result_or_error_and_nothing_else() {
        let id = NumberOrString::Number(-7);
        let read = |reply: Value| read_reply(&serde_json::to_vec(&reply).unwrap(), &id);
        let ok = read(json!({"jsonrpc": "2.0", "id": -7, "result": {
            "content": [{"type": "text", "text": "hi"}], "isError": false}}));
        let Some(Ok(ServerResult::CallToolResult(result))) = ok else {
            panic!("a plain result: {ok:?}");
        };
        assert_eq!(result.content.len(), 1);
        let error = read(json!({"jsonrpc": "2.0", "id": -7,
            "error": {"code": -32602, "message": "bad"}}));
        assert!(matches!(error, Some(Err(e)) if e.message == "bad"));
        // Another kind of result is read the general way, not lost.
        let asks = read(json!({"jsonrpc": "2.0", "id": -7, "result": {
            "resultType": "input_required",
            "inputRequests": {"a": {"method": "elicitation/create", "params": {
                "mode": "form", "message": "?", "requestedSchema": {"type": "object", "properties": {}}}}}}}));
        assert!(
            matches!(asks, Some(Ok(ServerResult::InputRequiredResult(_)))),
            "{asks:?}"
        );
        // Someone else's reply, a notification, or junk: not this call's.
        assert!(read(json!({"jsonrpc": "2.0", "id": -8, "result": {"content": []}})).is_none());
        assert!(
            read(json!({"jsonrpc": "2.0", "method": "notifications/progress",
            "params": {"progressToken": 1, "progress": 1}}))
            .is_none()
        );
        assert!(read_reply(b"not json", &id).is_none());
    }

    #[tokio::test]
    async fn an_event_stream_gives_this_calls_reply_after_whatever_comes_first() {
        let id = NumberOrString::Number(-3);
        let chunks = |parts: &[&'static str]| {
            futures::stream::iter(
                parts
                    .iter()
                    .map(|p| Ok::<_, std::io::Error>(bytes::Bytes::from_static(p.as_bytes())))
                    .collect::<Vec<_>>(),
            )
        };
        // A priming event, a progress notification, someone else's reply,
        // then this call's result split across chunks.
        let stream = chunks(&[
            "id: 0\ndata: \n\n",
            "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\n\n",
            "data: {\"jsonrpc\":\"2.0\",\"id\":-4,\"result\":{\"content\":[]}}\n\n",
            "data: {\"jsonrpc\":\"2.0\",\"id\":-3,\"res",
            "ult\":{\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]}}\n\n",
        ]);
        let reply = read_event_stream(stream, &id).await;
        assert!(
            matches!(&reply, Ok(Ok(ServerResult::CallToolResult(r))) if r.content.len() == 1),
            "{reply:?}"
        );
        let error = read_event_stream(
            chunks(&["data: {\"jsonrpc\":\"2.0\",\"id\":-3,\"error\":{\"code\":-32000,\"message\":\"no\"}}\n\n"]),
            &id,
        )
        .await;
        assert!(matches!(error, Ok(Err(e)) if e.message == "no"));
        let ended = read_event_stream(
            chunks(&["data: {\"jsonrpc\":\"2.0\",\"id\":-9,\"result\":{\"content\":[]}}\n\n"]),
            &id,
        )
        .await;
        assert_eq!(
            ended.unwrap_err(),
            "the event stream ended before the result"
        );
        // A stream that never ends its event is cut off at the bound.
        let endless = futures::stream::iter((0..17).map(|i| {
            let mut chunk = if i == 0 {
                b"data: ".to_vec()
            } else {
                Vec::new()
            };
            chunk.resize(1 << 20, b'a');
            Ok::<_, std::io::Error>(bytes::Bytes::from(chunk))
        }));
        let cut = read_event_stream(endless, &id).await.unwrap_err();
        assert!(cut.contains(&too_large()), "{cut}");
    }

    #[test]
    fn only_plain_names_go_into_the_header_as_they_are() {
        assert!(plain_header_value("get_weather").is_some());
        assert!(plain_header_value("a.b-c/d").is_some());
        assert!(plain_header_value(" padded").is_none());
        assert!(plain_header_value("naïve").is_none());
        assert!(plain_header_value("=?base64?eA==?=").is_none());
        assert!(plain_header_value("").is_none());
    }
}
