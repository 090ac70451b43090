//! Who is calling: gateway bearer tokens on `/mcp`, 401s that say where to
//! learn more, and RFC 9728 protected-resource metadata.

use std::sync::Arc;

use axum::{
    Json,
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use manifold_broker::{Caller, Governance};
use manifold_store::TOKEN_PREFIX;
use serde_json::json;

use crate::principal::principal_from_token;

/// Authentication settings of the HTTP surface.
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    /// Every request to `/mcp` needs a valid gateway token.
    pub required: bool,
    /// The canonical URL of `/mcp` for the metadata document; by default
    /// built from the request's `Host`.
    pub resource_url: Option<String>,
    pub console: ConsoleSessions,
}

/// How long a console sign-in lasts, and how its cookie is marked.
#[derive(Debug, Clone, Copy)]
pub struct ConsoleSessions {
    /// Ends after this long without a request.
    pub idle: std::time::Duration,
    /// Ends this long after sign-in, however busy.
    pub absolute: std::time::Duration,
    /// The console is served over https (`[gateway] public_url`): the
    /// cookie is `Secure` and `__Host-` prefixed.
    pub secure: bool,
}

impl Default for ConsoleSessions {
    fn default() -> Self {
        ConsoleSessions {
            idle: std::time::Duration::from_secs(30 * 60),
            absolute: std::time::Duration::from_secs(12 * 3600),
            secure: false,
        }
    }
}

impl ConsoleSessions {
    pub fn cookie_name(&self) -> &'static str {
        if self.secure {
            "__Host-manifold_console"
        } else {
            "manifold_console"
        }
    }

    /// The `Set-Cookie` value for session `id` (or, empty, one that clears it).
    pub fn cookie(&self, id: &str) -> String {
        let max_age = if id.is_empty() {
            0
        } else {
            self.absolute.as_secs()
        };
        format!(
            "{}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}{}",
            self.cookie_name(),
            if self.secure { "; Secure" } else { "" }
        )
    }
}

pub(crate) const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// The bearer token of a request, if it sent one.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

fn resource_url(auth: &AuthConfig, headers: &HeaderMap) -> String {
    if let Some(url) = &auth.resource_url {
        return url.clone();
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    format!("http://{host}/mcp")
}

fn metadata_url(auth: &AuthConfig, headers: &HeaderMap) -> String {
    let resource = resource_url(auth, headers);
    match resource
        .find("://")
        .and_then(|i| resource[i + 3..].find('/').map(|j| i + 3 + j))
    {
        Some(path_start) => format!(
            "{}{METADATA_PATH}{}",
            &resource[..path_start],
            &resource[path_start..]
        ),
        None => format!("{resource}{METADATA_PATH}"),
    }
}

fn unauthorized(auth: &AuthConfig, headers: &HeaderMap, reason: &str, had_token: bool) -> Response {
    let mut challenge = format!(
        "Bearer realm=\"manifold\", resource_metadata=\"{}\"",
        metadata_url(auth, headers)
    );
    if had_token {
        challenge.push_str(&format!(
            ", error=\"invalid_token\", error_description=\"{reason}\""
        ));
    }
    let mut response = (
        StatusCode::UNAUTHORIZED,
        Json(json!({ "error": "unauthorized", "message": format!("gateway token {reason}") })),
    )
        .into_response();
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

#[derive(Clone)]
pub(crate) struct AuthState {
    pub governance: Arc<Governance>,
    pub auth: AuthConfig,
}

/// The caller a gateway token names: `Ok(None)` without a bearer, a 401
/// response for a refused one.
pub(crate) async fn bearer_caller(
    state: &AuthState,
    headers: &HeaderMap,
) -> Result<Option<Caller>, Response> {
    match bearer(headers) {
        None => Ok(None),
        Some(token) => match state.governance.authenticate(token).await {
            Ok(caller) => Ok(Some(caller)),
            Err(error) => Err(unauthorized(&state.auth, headers, error.reason(), true)),
        },
    }
}

/// Resolves the caller of a `/mcp` request and puts it in the request's
/// extensions, or answers 401. A gateway token (`mfd_…`) is always checked;
/// with auth off, a request without one is anonymous, and any other bearer
/// only names a principal for upstream caches.
pub(crate) async fn authenticate(
    State(state): State<AuthState>,
    mut request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let caller = match bearer(headers) {
        Some(token) if token.starts_with(TOKEN_PREFIX) || state.auth.required => {
            match state.governance.authenticate(token).await {
                Ok(caller) => caller,
                Err(error) => {
                    return unauthorized(&state.auth, headers, error.reason(), true);
                }
            }
        }
        Some(other) => Caller::unauthenticated(principal_from_token(Some(other))),
        None if state.auth.required => {
            return unauthorized(&state.auth, headers, "missing", false);
        }
        None => Caller::anonymous(),
    };
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// RFC 9728 protected-resource metadata for `/mcp`.
pub(crate) async fn protected_resource(
    State(state): State<AuthState>,
    headers: HeaderMap,
) -> Json<serde_json::Value> {
    Json(json!({
        "resource": resource_url(&state.auth, &headers),
        "resource_name": "Manifold MCP gateway",
        "bearer_methods_supported": ["header"],
        "scopes_supported": ["discover", "call", "code", "admin"],
        "resource_documentation": "Create a gateway token with `manifold token create`; send it as Authorization: Bearer.",
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_url_inserts_the_well_known_path() {
        let auth = AuthConfig {
            required: true,
            resource_url: Some("https://gw.example/mcp".into()),
            ..AuthConfig::default()
        };
        assert_eq!(
            metadata_url(&auth, &HeaderMap::new()),
            "https://gw.example/.well-known/oauth-protected-resource/mcp"
        );
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:9"));
        assert_eq!(
            metadata_url(&AuthConfig::default(), &headers),
            "http://127.0.0.1:9/.well-known/oauth-protected-resource/mcp"
        );
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer  abc "),
        );
        assert_eq!(bearer(&headers), Some("abc"));
    }
}
