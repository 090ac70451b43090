//! A `tools/call` to a stateless (2026-07-28) HTTP upstream as one POST.
//!
//! rmcp's client sends each request through its service loop and its
//! transport worker: several task hops, and the message serialised twice
//! more to build headers. To a stateless upstream a call is one POST whose
//! reply carries the result, so a call nobody relays for (no progress, logs
//! or questions to pass back) is posted here directly. The POST itself is
//! rmcp's ([`StreamableHttpClient::post_message`]): status handling, size
//! limits and SSE parsing stay rmcp's; so do the message types. Everything
//! else (listings, legacy upstreams, stdio, relayed calls) stays on rmcp.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, RwLock,
        atomic::{AtomicI64, Ordering},
    },
};

use futures::StreamExt;
use http::{HeaderName, HeaderValue};
use rmcp::{
    model::{
        ClientCapabilities, ClientJsonRpcMessage, ClientRequest, GetMeta, Implementation,
        JsonObject, NumberOrString, ProtocolVersion, ServerJsonRpcMessage, ServerResult, Tool,
    },
    transport::streamable_http_client::{StreamableHttpClient, StreamableHttpPostResponse},
};
use serde_json::Value;

use crate::{CallContext, UpstreamError};

const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");

/// What a direct POST to one connected stateless upstream needs.
pub(crate) struct PlainPost {
    http: reqwest::Client,
    uri: Arc<str>,
    /// The configured headers plus `MCP-Protocol-Version`.
    headers: HashMap<HeaderName, HeaderValue>,
    protocol_version: ProtocolVersion,
    client_info: Implementation,
    client_capabilities: ClientCapabilities,
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
        mut headers: HashMap<HeaderName, HeaderValue>,
        protocol_version: ProtocolVersion,
        client_info: Implementation,
        client_capabilities: ClientCapabilities,
    ) -> Option<Self> {
        headers.insert(
            PROTOCOL_VERSION,
            HeaderValue::from_str(protocol_version.as_str()).ok()?,
        );
        Some(Self {
            http,
            uri: uri.into(),
            headers,
            protocol_version,
            client_info,
            client_capabilities,
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

    /// Posts `request` and waits for its result. `name`: from [`Self::takes`].
    pub(crate) async fn send(
        &self,
        server: &str,
        mut request: ClientRequest,
        name: HeaderValue,
        context: &CallContext,
        traceparent: Option<&str>,
    ) -> Result<ServerResult, UpstreamError> {
        let protocol = |message: String| UpstreamError::Protocol {
            server: server.to_string(),
            message: format!("tools/call failed: {message}"),
        };
        // The `_meta` rmcp's peer would send: version, client info and
        // capabilities, then the caller's own.
        let meta = request.get_meta_mut();
        meta.set_protocol_version(self.protocol_version.clone());
        meta.set_client_info(self.client_info.clone());
        meta.set_client_capabilities(self.client_capabilities.clone());
        meta.extend(context.modern_meta());
        let mut headers = self.headers.clone();
        headers.insert(MCP_METHOD, HeaderValue::from_static("tools/call"));
        headers.insert(MCP_NAME, name);
        if let Some(traceparent) = traceparent {
            meta.0.set_traceparent(traceparent.to_string());
            if let Ok(value) = HeaderValue::from_str(traceparent) {
                headers.insert(TRACEPARENT, value);
            }
        }
        let id = NumberOrString::Number(self.next_id.fetch_sub(1, Ordering::Relaxed));
        let message = ClientJsonRpcMessage::request(request, id.clone());
        let response = self
            .http
            .post_message(Arc::clone(&self.uri), message, None, None, headers)
            .await
            .map_err(|e| protocol(e.to_string()))?;
        let reply = match response {
            StreamableHttpPostResponse::Json(message, _) => message,
            StreamableHttpPostResponse::Sse(mut events, _) => loop {
                let Some(event) = events.next().await else {
                    return Err(protocol("the event stream ended before the result".into()));
                };
                let event = event.map_err(|e| protocol(e.to_string()))?;
                // Priming and keep-alive events carry no message.
                let Some(data) = event.data.filter(|d| !d.trim().is_empty()) else {
                    continue;
                };
                let message: ServerJsonRpcMessage = serde_json::from_str(&data)
                    .map_err(|e| protocol(format!("unreadable event: {e}")))?;
                match &message {
                    ServerJsonRpcMessage::Response(r) if r.id == id => break message,
                    ServerJsonRpcMessage::Error(e) if e.id.as_ref() == Some(&id) => break message,
                    // Progress and logs for nobody; a stateless upstream asks
                    // nothing in-stream.
                    _ => continue,
                }
            },
            StreamableHttpPostResponse::Accepted => {
                return Err(protocol(
                    "the upstream accepted the call without a result".into(),
                ));
            }
            _ => return Err(protocol("an unknown kind of reply".into())),
        };
        match reply {
            ServerJsonRpcMessage::Response(response) => Ok(response.result),
            ServerJsonRpcMessage::Error(error) => Err(UpstreamError::Rpc {
                server: server.to_string(),
                error: error.error,
            }),
            _ => Err(protocol(
                "a reply that is neither a result nor an error".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
    fn only_plain_names_go_into_the_header_as_they_are() {
        assert!(plain_header_value("get_weather").is_some());
        assert!(plain_header_value("a.b-c/d").is_some());
        assert!(plain_header_value(" padded").is_none());
        assert!(plain_header_value("naïve").is_none());
        assert!(plain_header_value("=?base64?eA==?=").is_none());
        assert!(plain_header_value("").is_none());
    }
}
