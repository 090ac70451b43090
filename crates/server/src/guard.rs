//! Checks every HTTP request passes before any route sees it: the body size
//! limit and the `Origin` check against DNS rebinding. (The `Host` check is
//! rmcp's, on `/mcp`.) Refusals are JSON with a code and a sentence.

use axum::{
    Json,
    extract::{Request, State},
    http::{HeaderMap, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use serde_json::json;

#[derive(Clone)]
pub(crate) struct Guard {
    /// Lowercase host names a browser page may call from (loopback and
    /// `allowed_hosts`).
    pub hosts: Vec<String>,
    pub max_body_bytes: usize,
}

fn refuse(status: StatusCode, code: &str, message: String) -> Response {
    (status, Json(json!({ "error": code, "message": message }))).into_response()
}

pub(crate) async fn guard(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    if let Some(length) = declared_length(request.headers())
        && length > guard.max_body_bytes
    {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!(
                "the request body is too large: {length} bytes, over the gateway's limit of {} (gateway.max_body_bytes)",
                guard.max_body_bytes
            ),
        );
    }
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default();
        if !origin_allowed(origin, &guard.hosts) {
            return refuse(
                StatusCode::FORBIDDEN,
                "forbidden_origin",
                format!(
                    "origin {origin:?} is not allowed: its host must be loopback or in gateway.allowed_hosts"
                ),
            );
        }
    }
    next.run(request).await
}

fn declared_length(headers: &HeaderMap) -> Option<usize> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// `scheme://host[:port]` whose host is one of `hosts`. `null` (sandboxed
/// frames, files) and anything unparsable are refused.
pub fn origin_allowed(origin: &str, hosts: &[String]) -> bool {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    if !matches!(scheme, "http" | "https") || rest.contains(['/', '@', '?', '#']) {
        return false;
    }
    let host = if let Some(v6) = rest.strip_prefix('[') {
        match v6.split_once(']') {
            Some((host, _)) => host,
            None => return false,
        }
    } else {
        rest.rsplit_once(':').map_or(rest, |(host, _)| host)
    };
    let host = host.to_ascii_lowercase();
    hosts
        .iter()
        .any(|allowed| allowed.eq_ignore_ascii_case(&host))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_must_name_an_allowed_host() {
        let hosts = vec![
            "localhost".into(),
            "127.0.0.1".into(),
            "::1".into(),
            "gw.example.com".into(),
        ];
        for ok in [
            "http://localhost:8080",
            "http://127.0.0.1",
            "https://GW.example.com",
            "http://[::1]:9",
        ] {
            assert!(origin_allowed(ok, &hosts), "{ok}");
        }
        for bad in [
            "null",
            "http://evil.example",
            "http://127.0.0.1.evil.example",
            "http://localhost@evil.example",
            "file://localhost",
            "http://gw.example.com.evil:80",
            "http://[::1",
            "",
        ] {
            assert!(!origin_allowed(bad, &hosts), "{bad}");
        }
    }
}
