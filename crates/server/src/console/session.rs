//! Signing in and out of the console, the guard on its pages, its own
//! script and style, and the headers every console answer carries.

use axum::{
    Form,
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    middleware::Next,
    response::{Html, IntoResponse, Redirect, Response},
};
use serde::Deserialize;

use super::{
    html::{esc, page},
    state::ConsoleState,
};
use crate::admin::{CONSOLE_HEADER, admin_caller, cookie};

const SCRIPT: &str = include_str!("console.js");
const STYLE: &str = include_str!("console.css");

/// The console loads only its own script and style, is never framed
/// (clickjacking), and no answer is sniffed into another type.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; \
     object-src 'none'; frame-ancestors 'none'";

pub(super) async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// Pages need the sign-in cookie (or an admin bearer); without one, the
/// sign-in page. A form the console posts (the playground's call) needs the
/// console's header too, as the admin API does, which a cross-site form
/// cannot send.
pub(super) async fn signed_in(
    State(state): State<ConsoleState>,
    mut request: Request,
    next: Next,
) -> Response {
    let (caller, by_cookie) = match admin_caller(&state.auth, request.headers()).await {
        Ok(found) => found,
        Err(_) => return Redirect::to("/console/login").into_response(),
    };
    let safe = matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    if by_cookie && !safe && !request.headers().contains_key(CONSOLE_HEADER) {
        return crate::admin::error(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("a console request that changes state needs the {CONSOLE_HEADER} header"),
        );
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

pub(super) async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
}

pub(super) async fn style() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE)
}

fn login_form(message: &str) -> String {
    let message = if message.is_empty() {
        String::new()
    } else {
        format!("<p class=\"error\" role=\"alert\">{}</p>", esc(message))
    };
    page(
        "Sign in",
        "",
        &format!(
            "{message}<form method=\"post\" action=\"/console/login\" class=\"card login\">\
             <label>Admin token <input type=\"password\" name=\"token\" autocomplete=\"off\" \
             placeholder=\"mfd_…\" required></label><button>Sign in</button>\
             <p class=\"hint\">A gateway token with the <code>admin</code> action: \
             <code>manifold token create --name ops --action admin</code>.</p></form>"
        ),
    )
}

pub(super) async fn login_page() -> Html<String> {
    Html(login_form(""))
}

#[derive(Deserialize)]
pub(super) struct LoginForm {
    token: String,
}

pub(super) async fn login(
    State(state): State<ConsoleState>,
    Form(form): Form<LoginForm>,
) -> Response {
    let token = form.token.trim();
    let mut headers = HeaderMap::new();
    let bearer = format!("Bearer {token}");
    match HeaderValue::from_str(&bearer) {
        Ok(value) => {
            headers.insert(header::AUTHORIZATION, value);
        }
        Err(_) => {
            return (
                StatusCode::UNAUTHORIZED,
                Html(login_form("Refused: that is not a gateway token.")),
            )
                .into_response();
        }
    }
    match admin_caller(&state.auth, &headers).await {
        Ok((caller, _)) => {
            // The cookie names a server-side session, never the token.
            let sessions = state.auth.auth.console;
            let absolute = i64::try_from(sessions.absolute.as_millis()).unwrap_or(i64::MAX);
            let created = state
                .auth
                .governance
                .store()
                .create_console_session(
                    caller.token_id().unwrap_or_default(),
                    manifold_store::now_ms(),
                    absolute,
                )
                .await;
            let id = match created {
                Ok(id) => id,
                Err(e) => {
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        Html(login_form(&format!("The store is unavailable: {e}"))),
                    )
                        .into_response();
                }
            };
            let mut response = Redirect::to("/console").into_response();
            if let Ok(value) = HeaderValue::from_str(&sessions.cookie(&id)) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            response
        }
        Err(refused) => {
            let reason = if refused.status() == StatusCode::FORBIDDEN {
                "Refused: this token lacks the admin action."
            } else {
                "Refused: unknown, expired or revoked token."
            };
            (StatusCode::UNAUTHORIZED, Html(login_form(reason))).into_response()
        }
    }
}

pub(super) async fn logout(State(state): State<ConsoleState>, headers: HeaderMap) -> Response {
    let sessions = state.auth.auth.console;
    if let Some(id) = cookie(&headers, sessions.cookie_name()).filter(|id| !id.is_empty())
        && let Err(error) = state.auth.governance.store().end_console_session(id).await
    {
        tracing::warn!(%error, "console sign-out not recorded");
    }
    let mut response = Redirect::to("/console/login").into_response();
    if let Ok(value) = HeaderValue::from_str(&sessions.cookie("")) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}
