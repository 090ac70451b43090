//! Who is calling: gateway bearer tokens and, with `[auth.oidc]`, access
//! tokens from the identity provider on `/mcp`; 401s and 403s that say where
//! to learn more and which scope to ask for; RFC 9728 protected-resource
//! metadata.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use axum::{
    Json,
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use manifold_broker::{Caller, Governance, UserGrant};
use manifold_identity::{AccessTokenVerifier, Rejected, Verified};
use manifold_store::{Action, RequestRows, TOKEN_PREFIX};
use serde_json::json;

use super::{principal::principal_from_token, requests::Parsed};
use crate::Mode;

/// Authentication settings of the HTTP surface.
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    /// Every request to `/mcp` needs a valid gateway token.
    pub required: bool,
    /// The canonical URL of `/mcp` for the metadata document; by default
    /// built from the request's `Host`.
    pub resource_url: Option<String>,
    pub console: ConsoleSessions,
    /// `[gateway] public_url`: where browsers reach the gateway (OAuth
    /// callbacks); by default built from the request's `Host`.
    pub public_url: Option<String>,
    /// Callers may also sign in with the identity provider.
    pub oidc: Option<Arc<OidcCallers>>,
}

/// Callers who sign in with the identity provider (`[auth.oidc]`).
#[derive(Debug)]
pub struct OidcCallers {
    pub verifier: AccessTokenVerifier,
    /// Each OAuth scope and the actions it grants.
    pub scopes: BTreeMap<String, BTreeSet<Action>>,
}

impl OidcCallers {
    /// The default mapping: `manifold:<action>` grants that action.
    pub fn default_scopes() -> BTreeMap<String, BTreeSet<Action>> {
        [Action::Discover, Action::Call, Action::Code, Action::Admin]
            .into_iter()
            .map(|action| (format!("manifold:{}", action.as_str()), [action].into()))
            .collect()
    }

    fn grant(&self, verified: Verified) -> UserGrant {
        let actions = verified
            .scopes
            .iter()
            .filter_map(|scope| self.scopes.get(scope))
            .flatten()
            .copied()
            .collect();
        UserGrant {
            user: verified.subject,
            groups: Arc::new(verified.groups.into_iter().collect()),
            actions,
            expires_at: verified.expires_at_ms,
        }
    }

    /// The scopes to ask for to hold `actions`: for each action, the first
    /// scope that grants it.
    fn scopes_for(&self, actions: impl IntoIterator<Item = Action>) -> Vec<&str> {
        let mut scopes: Vec<&str> = actions
            .into_iter()
            .filter_map(|action| {
                self.scopes
                    .iter()
                    .find(|(_, granted)| granted.contains(&action))
                    .map(|(scope, _)| scope.as_str())
            })
            .collect();
        scopes.sort_unstable();
        scopes.dedup();
        scopes
    }
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

/// The gateway's public origin: `[gateway] public_url`, else the request's
/// `Host` over http.
pub(crate) fn public_base(auth: &AuthConfig, headers: &HeaderMap) -> String {
    if let Some(url) = &auth.public_url {
        return url.trim_end_matches('/').to_string();
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    format!("http://{host}")
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

/// A refusal at the HTTP layer with its RFC 6750 challenge.
struct Challenge<'a> {
    status: StatusCode,
    /// `invalid_token` or `insufficient_scope`; none when no token came.
    error: Option<&'static str>,
    description: &'a str,
    /// The scopes a client should ask its provider for.
    scope: Vec<&'a str>,
}

impl Challenge<'_> {
    fn respond(self, auth: &AuthConfig, headers: &HeaderMap) -> Response {
        let mut challenge = format!(
            "Bearer realm=\"manifold\", resource_metadata=\"{}\"",
            metadata_url(auth, headers)
        );
        if !self.scope.is_empty() {
            challenge.push_str(&format!(", scope=\"{}\"", self.scope.join(" ")));
        }
        if let Some(error) = self.error {
            // Quotes and backslashes cannot appear in a quoted-string here.
            let description = self.description.replace(['"', '\\'], "'");
            challenge.push_str(&format!(
                ", error=\"{error}\", error_description=\"{description}\""
            ));
        }
        let (code, what) = if self.status == StatusCode::FORBIDDEN {
            ("forbidden", "access token")
        } else if self.status == StatusCode::SERVICE_UNAVAILABLE {
            ("identity_provider_unavailable", "access token")
        } else {
            ("unauthorized", "bearer token")
        };
        let mut response = (
            self.status,
            Json(json!({ "error": code, "message": format!("{what} {}", self.description) })),
        )
            .into_response();
        if self.status != StatusCode::SERVICE_UNAVAILABLE
            && let Ok(value) = HeaderValue::from_str(&challenge)
        {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, value);
        }
        response
    }
}

fn unauthorized(auth: &AuthConfig, headers: &HeaderMap, reason: &str, had_token: bool) -> Response {
    let scope = auth
        .oidc
        .as_ref()
        .map(|oidc| oidc.scopes_for([Action::Discover, Action::Call]))
        .unwrap_or_default();
    Challenge {
        status: StatusCode::UNAUTHORIZED,
        error: had_token.then_some("invalid_token"),
        description: reason,
        scope,
    }
    .respond(auth, headers)
}

#[derive(Clone)]
pub(crate) struct AuthState {
    pub governance: Arc<Governance>,
    pub auth: AuthConfig,
}

/// The caller a bearer names: `Ok(None)` without a bearer, a 401 (or, with
/// the identity provider away, a 503) response for a refused one. A gateway
/// token (`mfd_…`) is always checked, an access token when `[auth.oidc]` is
/// set; with auth off, any other bearer only names a principal for upstream
/// caches.
pub(crate) async fn bearer_caller(
    state: &AuthState,
    headers: &HeaderMap,
) -> Result<Option<(Caller, RequestRows)>, Response> {
    let Some(token) = bearer(headers) else {
        return Ok(None);
    };
    if let Some(oidc) = &state.auth.oidc
        && !token.starts_with(TOKEN_PREFIX)
        && looks_like_jwt(token)
    {
        return user_caller(state, oidc, headers, token).await.map(Some);
    }
    if token.starts_with(TOKEN_PREFIX) || state.auth.required {
        return match state.governance.authenticate_request(token).await {
            Ok(admitted) => Ok(Some(admitted)),
            Err(error) => Err(unauthorized(&state.auth, headers, error.reason(), true)),
        };
    }
    Ok(Some((
        Caller::unauthenticated(principal_from_token(Some(token))),
        RequestRows::default(),
    )))
}

/// Three base64url parts: the compact form of a signed JWT.
fn looks_like_jwt(token: &str) -> bool {
    let mut parts = 0;
    for part in token.split('.') {
        parts += 1;
        if part.is_empty()
            || !part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return false;
        }
    }
    parts == 3
}

async fn user_caller(
    state: &AuthState,
    oidc: &OidcCallers,
    headers: &HeaderMap,
    token: &str,
) -> Result<(Caller, RequestRows), Response> {
    let refused = match oidc.verifier.verify(token).await {
        Ok(verified) => {
            let grant = oidc.grant(verified);
            if !grant.actions.is_empty() {
                return Ok(state.governance.admit_user(grant).await);
            }
            "grants no scope of this gateway".to_string()
        }
        Err(Rejected::Unavailable(error)) => {
            tracing::warn!(%error, "an access token could not be verified");
            return Err(Challenge {
                status: StatusCode::SERVICE_UNAVAILABLE,
                error: None,
                description: "cannot be verified: the identity provider is unavailable",
                scope: Vec::new(),
            }
            .respond(&state.auth, headers));
        }
        Err(rejected) => rejected.to_string(),
    };
    state.governance.refuse_user_token(&refused).await;
    Err(unauthorized(&state.auth, headers, &refused, true))
}

/// The caller of a request: its bearer's, the anonymous caller when auth is
/// off and there is none, or the 401 to answer. Keep the [`RequestRows`]
/// until the request is answered.
pub(crate) async fn caller_of(
    state: &AuthState,
    headers: &HeaderMap,
) -> Result<(Caller, RequestRows), Response> {
    match bearer_caller(state, headers).await {
        Ok(Some(admitted)) => Ok(admitted),
        Err(response) => Err(response),
        Ok(None) if state.auth.required => {
            Err(unauthorized(&state.auth, headers, "missing", false))
        }
        Ok(None) => Ok((Caller::anonymous(), RequestRows::default())),
    }
}

/// [`caller_of`] as a layer: the caller goes in the request's extensions.
pub(crate) async fn authenticate(
    State(state): State<AuthState>,
    mut request: Request,
    next: Next,
) -> Response {
    match caller_of(&state, request.headers()).await {
        Ok((caller, _rows)) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(response) => response,
    }
}

/// The action a JSON-RPC request needs of its caller, if any.
fn action_needed(parsed: &Parsed, mode: Mode) -> Option<Action> {
    match parsed.method.as_str() {
        "tools/list" | "prompts/list" | "resources/list" | "resources/templates/list" => {
            Some(Action::Discover)
        }
        "prompts/get"
        | "resources/read"
        | "resources/subscribe"
        | "resources/unsubscribe"
        | "completion/complete" => Some(Action::Call),
        "tools/call" => Some(match parsed.tool.as_deref() {
            Some("execute_code") => Action::Code,
            Some(
                "search_tools"
                | "get_tool_details"
                | "search_available_servers"
                | "enable_server"
                | "disable_server",
            ) if mode == Mode::Progressive => Action::Discover,
            _ => Action::Call,
        }),
        _ => None,
    }
}

#[derive(Clone)]
pub(crate) struct StepUpState {
    pub auth: AuthConfig,
    pub mode: Mode,
}

/// A caller signed in with the identity provider whose token lacks the
/// scope a request needs gets 403 `insufficient_scope`, naming the scopes
/// to ask for, so its client can step up (the broker would refuse the
/// request anyway, but only in a form a client cannot act on). Reads the
/// [`Caller`] and [`Parsed`] the layers before put in the extensions.
pub(crate) fn step_up_refusal(state: &StepUpState, request: &Request) -> Option<Response> {
    let (Some(oidc), Some(caller), Some(parsed)) = (
        &state.auth.oidc,
        request.extensions().get::<Caller>(),
        request.extensions().get::<Parsed>(),
    ) else {
        return None;
    };
    let (Some(user), Some(needed)) = (&caller.user, action_needed(parsed, state.mode)) else {
        return None;
    };
    if user.actions.contains(&needed) {
        return None;
    }
    let description = format!("lacks the {} action", needed.as_str());
    Some(
        Challenge {
            status: StatusCode::FORBIDDEN,
            error: Some("insufficient_scope"),
            description: &description,
            scope: oidc.scopes_for(user.actions.iter().copied().chain([needed])),
        }
        .respond(&state.auth, request.headers()),
    )
}

/// RFC 9728 protected-resource metadata for `/mcp`.
pub(crate) async fn protected_resource(
    State(state): State<AuthState>,
    headers: HeaderMap,
) -> Json<serde_json::Value> {
    let resource = resource_url(&state.auth, &headers);
    Json(match &state.auth.oidc {
        Some(oidc) => json!({
            "resource": resource,
            "resource_name": "Manifold MCP gateway",
            "authorization_servers": [oidc.verifier.settings().issuer],
            "bearer_methods_supported": ["header"],
            "scopes_supported": oidc.scopes.keys().collect::<Vec<_>>(),
        }),
        None => json!({
            "resource": resource,
            "resource_name": "Manifold MCP gateway",
            "bearer_methods_supported": ["header"],
            "scopes_supported": ["discover", "call", "code", "admin"],
        }),
    })
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

    #[test]
    fn only_three_base64url_parts_look_like_a_jwt() {
        assert!(looks_like_jwt("eyJh.eyJz.c2ln"));
        assert!(!looks_like_jwt("mfd_abc"));
        assert!(!looks_like_jwt("a.b"));
        assert!(!looks_like_jwt("a..c"));
        assert!(!looks_like_jwt("a.b.c.d"));
        assert!(!looks_like_jwt("a.b+.c"));
    }
}
