//! `/oauth/sign-in`: where a caller's sign-in to a `credentials =
//! "per_principal"` server starts. The `auth_required` answer links here,
//! not to the authorization server, because whoever opens the link signs the
//! upstream account in and its token is kept under the pending sign-in's
//! principal. The browser carries no bearer, so the page asks for the
//! caller's token (a gateway token, or an access token from the identity
//! provider), refuses any other principal, and only then sets a short-lived
//! cookie bound to this sign-in and sends the browser to the authorization
//! server. `/oauth/callback`, on any replica, refuses a browser without the
//! cookie ([`check_binding`]).

use std::sync::Arc;

use axum::{
    Form, Router,
    extract::{Query, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{Html, IntoResponse, Response},
    routing::get,
};
use manifold_broker::Caller;
use manifold_store::oauth::{PENDING_MAX_AGE_MS, PendingSignIn, Sealer};
use manifold_upstream::oauth::SIGN_IN_PATH;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::{
    GatewayState,
    admin::cookie,
    console::html,
    http::auth::{AuthState, bearer_caller},
};

/// How long the cookie lives: time enough to sign in at the authorization
/// server, not a session.
const COOKIE_MAX_AGE_SECONDS: u64 = 600;

/// The page never loads anything, is never framed, and posts only to itself.
const CONTENT_SECURITY_POLICY: &str =
    "default-src 'none'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

#[derive(Deserialize)]
struct Start {
    state: Option<String>,
}

#[derive(Deserialize)]
struct SignInForm {
    state: String,
    #[serde(default)]
    token: String,
}

pub(crate) fn routes(gateway: Arc<GatewayState>) -> Router {
    Router::new()
        .route(SIGN_IN_PATH, get(form).post(sign_in))
        .with_state(gateway)
}

/// The cookie that binds the sign-in under `state` to a browser; one per
/// sign-in, so that sign-ins to two servers can be under way at once.
pub(crate) fn cookie_name(state: &str) -> String {
    format!(
        "mfd_sign_in_{}",
        &hex::encode(Sha256::digest(state.as_bytes()))[..16]
    )
}

fn binding_of(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// The sign-in under `state`, if it is under way.
async fn pending(gateway: &GatewayState, state: &str) -> Result<Option<PendingSignIn>, String> {
    gateway
        .governance()
        .store()
        .oauth_pending_sign_in(state, manifold_store::now_ms(), PENDING_MAX_AGE_MS)
        .await
        .map_err(|e| e.to_string())
}

/// Whether the browser that brought the callback of the sign-in under
/// `state` is the one its caller signed in at: a caller's sign-in needs the
/// cookie [`sign_in`] set; the server's shared sign-in is started by an
/// operator with an admin token and has none.
pub(crate) async fn check_binding(
    gateway: &GatewayState,
    state: &str,
    headers: &HeaderMap,
) -> Result<(), (StatusCode, String)> {
    let pending = pending(gateway, state)
        .await
        .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e))?;
    let Some(pending) = pending else {
        return Err((
            StatusCode::BAD_REQUEST,
            "this sign-in is unknown or has expired; start it again".into(),
        ));
    };
    if pending.principal.is_empty() {
        return Ok(());
    }
    let brought = cookie(headers, &cookie_name(state)).map(binding_of);
    match (brought, pending.binding) {
        (Some(brought), Some(bound)) if brought == bound => Ok(()),
        _ => Err((
            StatusCode::FORBIDDEN,
            "this browser did not start this sign-in. Open the sign-in link the gateway gave \
             you, and sign in there as the caller it is for."
                .into(),
        )),
    }
}

fn page(status: StatusCode, body: &str) -> Response {
    let html =
        format!("<!doctype html><meta charset=\"utf-8\"><title>Manifold sign-in</title>{body}");
    let mut response = (status, Html(html)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

fn message(status: StatusCode, text: &str) -> Response {
    page(status, &format!("<p>{}</p>", html::esc(text)))
}

fn sign_in_form(state: &str, server: &str, refusal: &str) -> String {
    let refusal = if refusal.is_empty() {
        String::new()
    } else {
        format!("<p role=\"alert\">{}</p>", html::esc(refusal))
    };
    format!(
        "<h1>Sign in to {server}</h1>{refusal}\
         <p>The gateway keeps the account you sign in with at {server} for the caller that \
         asked for this sign-in, so first show that you are that caller: paste its token \
         (a gateway token, or an access token from the identity provider).</p>\
         <form method=\"post\" action=\"{SIGN_IN_PATH}\">\
         <input type=\"hidden\" name=\"state\" value=\"{state}\">\
         <label>Token <input type=\"password\" name=\"token\" autocomplete=\"off\" required></label>\
         <button>Continue to {server}</button></form>",
        server = html::esc(server),
        state = html::esc(state),
    )
}

async fn form(State(gateway): State<Arc<GatewayState>>, Query(q): Query<Start>) -> Response {
    let Some(state) = q.state else {
        return message(StatusCode::BAD_REQUEST, "This sign-in link has no state.");
    };
    match pending(&gateway, &state).await {
        Ok(Some(pending)) if !pending.principal.is_empty() => {
            page(StatusCode::OK, &sign_in_form(&state, &pending.server, ""))
        }
        Ok(_) => message(
            StatusCode::BAD_REQUEST,
            "This sign-in is unknown or has expired; call the tool again for a new link.",
        ),
        Err(error) => message(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("The store is unavailable: {error}"),
        ),
    }
}

/// Who pasted `token`: the caller `/mcp` would see with it as its bearer.
async fn caller_of_token(gateway: &GatewayState, token: &str) -> Option<Caller> {
    let state = AuthState {
        governance: Arc::clone(gateway.governance()),
        auth: gateway.auth.clone(),
    };
    let mut headers = HeaderMap::new();
    if !token.is_empty() {
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).ok()?,
        );
    }
    match bearer_caller(&state, &headers).await {
        Ok(Some((caller, _rows))) => Some(caller),
        Ok(None) if !gateway.auth.required => Some(Caller::anonymous()),
        _ => None,
    }
}

async fn sign_in(State(gateway): State<Arc<GatewayState>>, Form(f): Form<SignInForm>) -> Response {
    let pending = match pending(&gateway, &f.state).await {
        Ok(Some(pending)) if !pending.principal.is_empty() => pending,
        Ok(_) => {
            return message(
                StatusCode::BAD_REQUEST,
                "This sign-in is unknown or has expired; call the tool again for a new link.",
            );
        }
        Err(error) => {
            return message(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("The store is unavailable: {error}"),
            );
        }
    };
    let refuse = |text: &str| {
        page(
            StatusCode::FORBIDDEN,
            &sign_in_form(&f.state, &pending.server, text),
        )
    };
    let Some(caller) = caller_of_token(&gateway, f.token.trim()).await else {
        return refuse("Refused: that token is not valid here.");
    };
    if caller.principal.0 != pending.principal {
        tracing::warn!(server = %pending.server, caller = %caller.name, "a sign-in link opened by another caller was refused");
        return refuse("Refused: this sign-in is for another caller. Use your own sign-in link.");
    }
    let Some(authorize_url) = pending.authorize_url else {
        return message(
            StatusCode::BAD_REQUEST,
            "This sign-in has no authorization server to continue to; call the tool again for a new link.",
        );
    };
    // 256 random bits, in characters a cookie may carry.
    let secret = binding_of(&Sealer::generate_secret());
    let bound = gateway
        .governance()
        .store()
        .bind_oauth_pending(&f.state, &binding_of(&secret))
        .await;
    match bound {
        Ok(true) => {}
        Ok(false) => {
            return message(
                StatusCode::BAD_REQUEST,
                "This sign-in has just ended; call the tool again for a new link.",
            );
        }
        Err(error) => {
            return message(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("The store is unavailable: {error}"),
            );
        }
    }
    let secure = gateway
        .auth
        .public_url
        .as_deref()
        .is_some_and(|url| url.starts_with("https://"));
    let cookie = format!(
        "{}={secret}; HttpOnly; SameSite=Lax; Path=/oauth; Max-Age={COOKIE_MAX_AGE_SECONDS}{}",
        cookie_name(&f.state),
        if secure { "; Secure" } else { "" }
    );
    let mut response = StatusCode::SEE_OTHER.into_response();
    let headers = response.headers_mut();
    match (
        HeaderValue::from_str(&cookie),
        HeaderValue::from_str(&authorize_url),
    ) {
        (Ok(cookie), Ok(location)) => {
            headers.insert(header::SET_COOKIE, cookie);
            headers.insert(header::LOCATION, location);
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }
        _ => message(
            StatusCode::INTERNAL_SERVER_ERROR,
            "The authorization URL cannot be sent to a browser.",
        ),
    }
}

/// The header that ends the sign-in's cookie once its callback is done.
pub(crate) fn expired_cookie(state: &str) -> String {
    format!(
        "{}=; HttpOnly; SameSite=Lax; Path=/oauth; Max-Age=0",
        cookie_name(state)
    )
}

#[cfg(test)]
mod tests {
    use axum::{body::Body, http::Request};
    use manifold_broker::Governance;
    use manifold_catalog::ToolCatalog;
    use manifold_store::{Action, NewToken, Store};
    use tower::ServiceExt;

    use super::*;
    use crate::{GatewayParts, http::auth::AuthConfig, provider::oauth_callback};

    const AUTHORIZE: &str = "https://as.example/authorize?client_id=c&state=csrf-1";

    /// A gateway with auth on, two callers' tokens, and alice's sign-in to
    /// `tracker` under way (as an `auth_required` answer leaves it).
    async fn gateway() -> (Router, Store, String, String) {
        let store = Store::connect("sqlite::memory:").await.unwrap();
        let token = |name: &'static str| {
            let store = store.clone();
            async move {
                store
                    .create_token(NewToken::new(name, [Action::Call], ["*"]))
                    .await
                    .unwrap()
            }
        };
        let (alice, alice_token) = token("alice").await;
        let (_, bob_token) = token("bob").await;
        let sealer = Sealer::new(Sealer::generate_secret().as_bytes()).unwrap();
        let now = manifold_store::now_ms();
        let principal = format!("token:{}", alice.id);
        store
            .save_oauth_pending(&sealer, "csrf-1", "tracker", &principal, b"pkce", now)
            .await
            .unwrap();
        store.link_oauth_pending("csrf-1", AUTHORIZE).await.unwrap();
        let mut parts = GatewayParts::new(
            ToolCatalog::new(Vec::new(), true),
            Governance::new(store.clone(), Default::default()),
        );
        parts.auth = AuthConfig {
            required: true,
            ..AuthConfig::default()
        };
        let state = GatewayState::new(parts);
        let router = routes(Arc::clone(&state)).merge(oauth_callback::routes(state));
        (router, store, alice_token, bob_token)
    }

    async fn send(router: &Router, request: Request<Body>) -> (StatusCode, HeaderMap, String) {
        let response = router.clone().oneshot(request).await.unwrap();
        let (status, headers) = (response.status(), response.headers().clone());
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, headers, String::from_utf8_lossy(&body).into_owned())
    }

    async fn post_token(router: &Router, token: &str) -> (StatusCode, HeaderMap, String) {
        let body = format!("state=csrf-1&token={token}");
        let request = Request::post(SIGN_IN_PATH)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(body))
            .unwrap();
        send(router, request).await
    }

    async fn callback(router: &Router, cookie: Option<&str>) -> (StatusCode, String) {
        let mut request = Request::get("/oauth/callback?code=the-code&state=csrf-1");
        if let Some(cookie) = cookie {
            request = request.header(header::COOKIE, cookie);
        }
        let (status, _, body) = send(router, request.body(Body::empty()).unwrap()).await;
        (status, body)
    }

    #[tokio::test]
    async fn another_caller_cannot_take_over_a_sign_in_link() {
        let (router, store, _alice, bob) = gateway().await;
        // The link opens a page that asks who is signing in.
        let (status, _, body) = send(
            &router,
            Request::get(format!("{SIGN_IN_PATH}?state=csrf-1"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body.contains("Sign in to tracker"), "{body}");
        assert!(!body.contains("as.example"), "{body}");
        // Bob, or a token that is no token, is refused, and nothing is bound.
        for token in [bob.as_str(), "mfd_not-a-token", ""] {
            let (status, headers, body) = post_token(&router, token).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
            assert!(headers.get(header::SET_COOKIE).is_none());
            assert!(headers.get(header::LOCATION).is_none());
        }
        let pending = store
            .oauth_pending_sign_in("csrf-1", manifold_store::now_ms(), PENDING_MAX_AGE_MS)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(pending.binding, None);
        // A browser that went to the authorization server without the page
        // (the bare link, as sent to somebody else) cannot finish it.
        let (status, body) = callback(&router, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert!(body.contains("did not start this sign-in"), "{body}");
    }

    #[tokio::test]
    async fn the_caller_itself_is_sent_on_with_a_cookie_only_its_browser_has() {
        let (router, _store, alice, _bob) = gateway().await;
        let (status, headers, body) = post_token(&router, &alice).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
        assert_eq!(headers[header::LOCATION], AUTHORIZE);
        let set_cookie = headers[header::SET_COOKIE].to_str().unwrap();
        for attribute in ["HttpOnly", "SameSite=Lax", "Path=/oauth", "Max-Age=600"] {
            assert!(set_cookie.contains(attribute), "{set_cookie}");
        }
        let cookie = set_cookie.split(';').next().unwrap();
        assert!(cookie.starts_with(&cookie_name("csrf-1")));
        // Another browser (no cookie, or a made-up one) is refused...
        let (status, _) = callback(&router, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let forged = format!("{}=00", cookie_name("csrf-1"));
        let (status, _) = callback(&router, Some(&forged)).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        // ...and alice's browser passes the check, on to the code exchange
        // (which this test's gateway, with no vault, cannot make).
        let (status, body) = callback(&router, Some(cookie)).await;
        assert!(!body.contains("did not start this sign-in"), "{body}");
        assert!(body.contains("no OAuth vault"), "{status}: {body}");
    }
}
