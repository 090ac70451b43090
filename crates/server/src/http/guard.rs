//! Checks every HTTP request passes before any route sees it: the body size
//! limit, and the `Host` and `Origin` checks against DNS rebinding. Only the
//! load balancers' probes (`/healthz`, `/readyz`), which call by IP, skip the
//! `Host` check. Refusals are JSON with a code and a sentence.

use std::sync::Arc;

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

/// Routes a load balancer calls by address, whatever `Host` it sends.
const PROBES: &[&str] = &["/healthz", "/readyz"];

/// The refusal `request` gets, if any.
pub(crate) fn refusal(guard: &Guard, request: &Request) -> Option<Response> {
    if !PROBES.contains(&request.uri().path()) {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| request.uri().authority().map(|a| a.as_str()))
            .unwrap_or_default();
        if !host_allowed(host, &guard.hosts) {
            return Some(refuse(
                StatusCode::FORBIDDEN,
                "forbidden_host",
                format!(
                    "host {host:?} is not allowed: it must be loopback or in gateway.allowed_hosts (DNS-rebinding guard)"
                ),
            ));
        }
    }
    if let Some(length) = declared_length(request.headers())
        && length > guard.max_body_bytes
    {
        return Some(refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!(
                "the request body is too large: {length} bytes, over the gateway's limit of {} (gateway.max_body_bytes)",
                guard.max_body_bytes
            ),
        ));
    }
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default();
        if !origin_allowed(origin, &guard.hosts) {
            return Some(refuse(
                StatusCode::FORBIDDEN,
                "forbidden_origin",
                format!(
                    "origin {origin:?} is not allowed: its host must be loopback or in gateway.allowed_hosts"
                ),
            ));
        }
    }
    None
}

/// [`refusal`] as a layer, for every route but `/mcp`, whose pipeline
/// calls it first itself.
pub(crate) async fn guard(
    State(guard): State<Arc<Guard>>,
    request: Request,
    next: Next,
) -> Response {
    match refusal(&guard, &request) {
        Some(refused) => refused,
        None => next.run(request).await,
    }
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
    matches!(scheme, "http" | "https") && host_allowed(rest, hosts)
}

/// A `Host` value, `host[:port]` or `[v6][:port]`, whose host is one of
/// `hosts`. Empty, or anything with a path, user or query in it, is refused.
pub fn host_allowed(authority: &str, hosts: &[String]) -> bool {
    if authority.is_empty() || authority.contains(['/', '@', '?', '#']) {
        return false;
    }
    let host = if let Some(v6) = authority.strip_prefix('[') {
        match v6.split_once(']') {
            Some((host, _)) => host,
            None => return false,
        }
    } else {
        authority
            .rsplit_once(':')
            .map_or(authority, |(host, _)| host)
    };
    hosts
        .iter()
        .any(|allowed| allowed.eq_ignore_ascii_case(host))
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

    #[test]
    fn hosts_must_be_allowed_names() {
        let hosts = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
        for ok in ["localhost:8080", "127.0.0.1", "[::1]:9", "LOCALHOST"] {
            assert!(host_allowed(ok, &hosts), "{ok}");
        }
        for bad in [
            "",
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.nip.io",
            "localhost@evil.example",
            "[::1",
            "10.0.0.5:8080",
        ] {
            assert!(!host_allowed(bad, &hosts), "{bad}");
        }
    }
}
