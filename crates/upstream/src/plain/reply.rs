//! Reading a plain call's reply: its result or JSON-RPC error, from a JSON
//! body or an event stream, within rmcp's bound on a reply's size.

use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, StatusCode, header};
use http_body_util::{BodyDataStream, BodyExt, combinators::BoxBody};
use rmcp::model::{CallToolResult, ErrorData, NumberOrString, ServerJsonRpcMessage, ServerResult};
use serde::Deserialize;

/// The most a reply may hold, JSON or the whole event stream: rmcp's own
/// default for a JSON reply. `max_result_bytes` then applies to the result.
const MAX_REPLY_BYTES: usize = 16 * 1024 * 1024;

pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A reply's body, from either client.
pub(super) type ReplyBody = BoxBody<Bytes, BoxError>;

/// This call's result or JSON-RPC error from `response`; the outer error
/// says why there is neither.
pub(super) async fn read_response(
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
    use super::*;
    use serde_json::{Value, json};

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
}
