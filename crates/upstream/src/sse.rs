//! The legacy HTTP+SSE transport (2024-11-05) as an rmcp client transport.
//!
//! A `GET` of the server's URL opens an event stream whose first `endpoint`
//! event names where the client POSTs its messages; the server's messages,
//! replies included, come on the stream. rmcp 3.11 has no such transport, so
//! this is one on its [`Transport`] trait, beside its Streamable HTTP client.
//!
//! The endpoint must be same-origin with the server's URL: an upstream must
//! not send the gateway's POSTs, and the headers they carry, elsewhere.

use std::{borrow::Cow, collections::HashMap, time::Duration};

use futures::StreamExt;
use http::{HeaderName, HeaderValue, StatusCode, header};
use reqwest::Url;
use rmcp::{
    RoleClient,
    model::{ClientJsonRpcMessage, ServerJsonRpcMessage},
    transport::{AuthClient, Transport},
};
use tokio::sync::mpsc;

use crate::trace::{TracingHttpClient, with_traceparent};

/// The most one event may hold: rmcp's own bound on an SSE event.
const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;
/// Messages read ahead of rmcp's loop; past this the reader waits, and so
/// does the upstream's stream (TCP back-pressure), rather than buffering.
const READ_AHEAD: usize = 64;

/// A failed POST, or a stream that could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct SseError(String);

/// The OAuth client whose token each request carries, for an `oauth` server.
pub(crate) type TokenSource = AuthClient<TracingHttpClient>;

/// What every request to the server carries.
#[derive(Clone)]
struct Requests {
    http: reqwest::Client,
    headers: HashMap<HeaderName, HeaderValue>,
    oauth: Option<TokenSource>,
    post_timeout: Duration,
}

impl Requests {
    async fn bearer(&self) -> Result<Option<String>, String> {
        match &self.oauth {
            Some(oauth) => oauth
                .get_access_token()
                .await
                .map(Some)
                .map_err(|e| e.to_string()),
            None => Ok(None),
        }
    }

    async fn get(&self, url: &Url) -> Result<reqwest::Response, String> {
        let mut request = self
            .http
            .get(url.clone())
            .header(header::ACCEPT, "text/event-stream");
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        if let Some(token) = self.bearer().await? {
            request = request.bearer_auth(token);
        }
        request.send().await.map_err(|e| e.to_string())
    }

    async fn post(&self, url: &Url, message: &ClientJsonRpcMessage) -> Result<(), String> {
        let body = serde_json::to_vec(message).map_err(|e| e.to_string())?;
        let mut request = self
            .http
            .post(url.clone())
            .timeout(self.post_timeout)
            .header(header::CONTENT_TYPE, "application/json");
        for (name, value) in with_traceparent(message, self.headers.clone()) {
            request = request.header(name, value);
        }
        if let Some(token) = self.bearer().await? {
            request = request.bearer_auth(token);
        }
        let response = request.body(body).send().await.map_err(|e| e.to_string())?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("the message endpoint answered HTTP {status}"))
        }
    }
}

/// One open HTTP+SSE session with an upstream.
pub(crate) struct SseClientTransport {
    requests: Requests,
    endpoint: Url,
    incoming: mpsc::Receiver<ServerJsonRpcMessage>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for SseClientTransport {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl SseClientTransport {
    /// Opens the event stream at `url` and waits for its `endpoint` event.
    pub(crate) async fn connect(
        http: reqwest::Client,
        url: &str,
        headers: HashMap<HeaderName, HeaderValue>,
        oauth: Option<TokenSource>,
        post_timeout: Duration,
    ) -> Result<Self, String> {
        let url = Url::parse(url).map_err(|e| format!("bad url: {e}"))?;
        let requests = Requests {
            http,
            headers,
            oauth,
            post_timeout,
        };
        let response = requests.get(&url).await?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("GET for the event stream answered HTTP {status}"));
        }
        if !is_event_stream(response.headers()) {
            return Err("GET for the event stream answered something else".into());
        }
        let mut events = Box::pin(sse_stream::SseStream::from_bytes_stream(bounded_events(
            response.bytes_stream(),
        )));
        let endpoint = loop {
            match events.next().await {
                Some(Ok(event)) if event.event.as_deref() == Some("endpoint") => {
                    break event.data.unwrap_or_default();
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(format!("the event stream broke: {e}")),
                None => return Err("the event stream ended before its endpoint event".into()),
            }
        };
        let endpoint = same_origin_endpoint(&url, endpoint.trim())?;
        let (sender, incoming) = mpsc::channel(READ_AHEAD);
        let reader = tokio::spawn(async move {
            while let Some(Ok(event)) = events.next().await {
                if !matches!(event.event.as_deref(), None | Some("message")) {
                    continue;
                }
                let Some(data) = event.data.filter(|d| !d.trim().is_empty()) else {
                    continue;
                };
                match serde_json::from_str::<ServerJsonRpcMessage>(&data) {
                    Ok(message) => {
                        if sender.send(message).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::debug!("unreadable message on an upstream event stream: {e}")
                    }
                }
            }
        });
        Ok(Self {
            requests,
            endpoint,
            incoming,
            reader,
        })
    }
}

fn is_event_stream(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("text/event-stream"))
}

/// The `endpoint` event's URL, resolved against the stream's; refused
/// unless it has the same scheme, host and port.
pub(crate) fn same_origin_endpoint(stream: &Url, endpoint: &str) -> Result<Url, String> {
    let resolved = stream
        .join(endpoint)
        .map_err(|e| format!("the endpoint event is not a URL: {e}"))?;
    if resolved.origin() != stream.origin() {
        return Err(format!(
            "the endpoint event names another origin ({}); refused",
            resolved.origin().ascii_serialization()
        ));
    }
    Ok(resolved)
}

/// The stream's bytes, failing once one event passes [`MAX_EVENT_BYTES`]
/// without its ending blank line, so a hostile upstream cannot grow the
/// parser's buffer without end.
fn bounded_events<S>(
    stream: S,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send + 'static
where
    S: futures::Stream<Item = Result<bytes::Bytes, reqwest::Error>> + Send + 'static,
{
    let mut pending = 0usize;
    stream.map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        pending = match last_event_end(&chunk) {
            Some(end) => chunk.len() - end,
            None => pending + chunk.len(),
        };
        if pending > MAX_EVENT_BYTES {
            return Err(std::io::Error::other(format!(
                "an event is over {MAX_EVENT_BYTES} bytes"
            )));
        }
        Ok(chunk)
    })
}

/// Where the last event in `chunk` ends (just past a blank line), if any.
fn last_event_end(chunk: &[u8]) -> Option<usize> {
    [&b"\r\n\r\n"[..], b"\n\n", b"\r\r"]
        .iter()
        .filter_map(|end| {
            chunk
                .windows(end.len())
                .rposition(|w| w == *end)
                .map(|at| at + end.len())
        })
        .max()
}

impl Transport<RoleClient> for SseClientTransport {
    type Error = SseError;

    fn name() -> Cow<'static, str> {
        "sse".into()
    }

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let requests = self.requests.clone();
        let endpoint = self.endpoint.clone();
        async move { requests.post(&endpoint, &item).await.map_err(SseError) }
    }

    fn receive(&mut self) -> impl Future<Output = Option<ServerJsonRpcMessage>> + Send {
        self.incoming.recv()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.reader.abort();
        self.incoming.close();
        Ok(())
    }
}

/// The backwards-compatibility test of the 2024-11-05 transport: whether a
/// POST of `initialize` to `url` gets 400, 404 or 405, the answers of a
/// server that speaks only the old transport. A session such a POST opened
/// on a Streamable HTTP server is ended at once.
pub(crate) async fn post_is_refused(
    http: &reqwest::Client,
    url: &str,
    headers: &HashMap<HeaderName, HeaderValue>,
    oauth: Option<&TokenSource>,
) -> bool {
    let initialize = serde_json::json!({
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "manifold", "version": env!("CARGO_PKG_VERSION")},
        },
    });
    let bearer = match oauth {
        Some(oauth) => oauth.get_access_token().await.ok(),
        None => None,
    };
    let with_headers = |mut request: reqwest::RequestBuilder| {
        for (name, value) in headers {
            request = request.header(name, value);
        }
        if let Some(token) = &bearer {
            request = request.bearer_auth(token);
        }
        request
    };
    let request = with_headers(http.post(url))
        .header(header::ACCEPT, "application/json, text/event-stream")
        .timeout(Duration::from_secs(10))
        .json(&initialize);
    let Ok(response) = request.send().await else {
        return false;
    };
    let status = response.status();
    if let Some(session) = response.headers().get("mcp-session-id").cloned() {
        let _ = with_headers(http.delete(url))
            .header("mcp-session-id", session)
            .timeout(Duration::from_secs(5))
            .send()
            .await;
    }
    matches!(
        status,
        StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_on_another_origin_is_refused() {
        let stream = Url::parse("http://127.0.0.1:8000/sse").unwrap();
        let same = same_origin_endpoint(&stream, "/messages/?session_id=ab").unwrap();
        assert_eq!(
            same.as_str(),
            "http://127.0.0.1:8000/messages/?session_id=ab"
        );
        for foreign in [
            "http://evil.example/messages",
            "https://127.0.0.1:8000/messages",
            "http://127.0.0.1:8001/messages",
            "//evil.example/messages",
        ] {
            assert!(
                same_origin_endpoint(&stream, foreign).is_err(),
                "{foreign} was accepted"
            );
        }
    }

    /// An upstream whose stream names `endpoint`, then stays open.
    async fn serve_endpoint(endpoint: &'static str) -> String {
        let stream = move || async move {
            let first = format!("event: endpoint\ndata: {endpoint}\n\n");
            let body = futures::stream::once(async move { Ok::<_, std::io::Error>(first) })
                .chain(futures::stream::pending());
            (
                [(header::CONTENT_TYPE, "text/event-stream")],
                axum::body::Body::from_stream(body),
            )
        };
        let app = axum::Router::new().route("/sse", axum::routing::get(stream));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/sse", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    async fn connect(url: &str) -> Result<SseClientTransport, String> {
        SseClientTransport::connect(
            reqwest::Client::new(),
            url,
            HashMap::new(),
            None,
            Duration::from_secs(5),
        )
        .await
    }

    #[tokio::test]
    async fn an_upstream_cannot_send_the_posts_to_another_origin() {
        let foreign = serve_endpoint("http://evil.example/messages?session_id=1").await;
        let error = connect(&foreign)
            .await
            .err()
            .expect("a foreign endpoint is refused");
        assert!(error.contains("another origin"), "{error}");
        let own = serve_endpoint("/messages?session_id=1").await;
        let transport = connect(&own)
            .await
            .expect("a same-origin endpoint is taken");
        assert_eq!(transport.endpoint.path(), "/messages");
        assert!(own.starts_with(&transport.endpoint.origin().ascii_serialization()));
    }

    #[test]
    fn an_event_ends_at_its_blank_line() {
        assert_eq!(last_event_end(b"data: x\n\ndata: y"), Some(9));
        assert_eq!(last_event_end(b"data: x\n"), None);
        assert_eq!(last_event_end(b"data: x\r\n\r\n"), Some(11));
    }
}
