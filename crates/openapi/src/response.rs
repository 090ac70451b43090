//! An HTTP answer as a tool result: JSON gives structured content and its
//! text, text gives text, and a status outside 2xx is an error with the
//! status and the start of the body.

use serde_json::{Map, Value};

/// A tool result, before it is put into MCP's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The HTTP status.
    pub status: u16,
    pub is_error: bool,
    pub text: String,
    /// A JSON object body (MCP's structured content must be an object).
    pub structured: Option<Map<String, Value>>,
}

/// The result for a response with `status`, `content_type` and `body`; an
/// error's body is cut to `excerpt_chars`.
pub fn outcome(
    status: http::StatusCode,
    content_type: Option<&str>,
    body: &[u8],
    excerpt_chars: usize,
) -> Outcome {
    let essence = content_type
        .and_then(|t| t.split(';').next())
        .map(|t| t.trim().to_ascii_lowercase())
        .unwrap_or_default();
    let is_json = essence == "application/json" || essence.ends_with("+json");
    if !status.is_success() {
        let text = String::from_utf8_lossy(body);
        let mut message = format!("HTTP {status}");
        if !text.trim().is_empty() {
            message.push_str(": ");
            let mut chars = text.chars();
            message.extend(chars.by_ref().take(excerpt_chars));
            if chars.next().is_some() {
                message.push_str(" [cut]");
            }
        }
        return Outcome {
            status: status.as_u16(),
            is_error: true,
            text: message,
            structured: None,
        };
    }
    if body.is_empty() {
        return Outcome {
            status: status.as_u16(),
            is_error: false,
            text: format!("HTTP {status}, no content"),
            structured: None,
        };
    }
    let Ok(text) = std::str::from_utf8(body) else {
        let kind = if essence.is_empty() {
            "unknown type"
        } else {
            &essence
        };
        return Outcome {
            status: status.as_u16(),
            is_error: false,
            text: format!("HTTP {status}: {} bytes of {kind}, not shown", body.len()),
            structured: None,
        };
    };
    let structured = if is_json {
        match serde_json::from_str(text) {
            Ok(Value::Object(object)) => Some(object),
            _ => None,
        }
    } else {
        None
    };
    Outcome {
        status: status.as_u16(),
        is_error: false,
        text: text.to_string(),
        structured,
    }
}
