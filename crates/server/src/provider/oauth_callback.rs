//! `/oauth/callback`: where an upstream's authorization server sends the
//! browser back after a person signed the gateway in (started from the
//! console or `POST /admin/servers/{name}/sign-in`, or for one caller at
//! [`super::sign_in`], on any replica). The state parameter names the
//! sign-in kept in the store; nothing else is trusted from the query. A
//! caller's sign-in finishes only in the browser its page bound it to.

use std::sync::Arc;

use axum::{
    Router,
    extract::{Query, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{Html, IntoResponse, Response},
    routing::get,
};
use serde::Deserialize;

use super::sign_in;
use crate::{GatewayState, admin::ops, console::html};

#[derive(Deserialize)]
struct Callback {
    code: Option<String>,
    state: Option<String>,
    iss: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

pub(crate) fn routes(gateway: Arc<GatewayState>) -> Router {
    Router::new()
        .route("/oauth/callback", get(callback))
        .with_state(gateway)
}

async fn callback(
    State(gateway): State<Arc<GatewayState>>,
    headers: HeaderMap,
    Query(q): Query<Callback>,
) -> Response {
    let page = |status: StatusCode, text: String| {
        let body = format!(
            "<!doctype html><meta charset=\"utf-8\"><title>Manifold sign-in</title><p>{}</p>",
            html::esc(&text)
        );
        (status, Html(body)).into_response()
    };
    if let Some(error) = q.error {
        return page(
            StatusCode::BAD_REQUEST,
            format!(
                "The authorization server refused the sign-in: {error} {}",
                q.error_description.unwrap_or_default()
            ),
        );
    }
    let (Some(code), Some(state)) = (q.code, q.state) else {
        return page(
            StatusCode::BAD_REQUEST,
            "This callback has no code and state.".into(),
        );
    };
    if let Err((status, error)) = sign_in::check_binding(&gateway, &state, &headers).await {
        return page(status, format!("Sign-in refused: {error}"));
    }
    let mut response = match ops::finish_sign_in(&gateway, &state, &code, q.iss.as_deref()).await {
        Ok(server) => page(
            StatusCode::OK,
            format!("Signed in to {server}. You may close this tab."),
        ),
        Err(error) => page(StatusCode::BAD_REQUEST, format!("Sign-in failed: {error}")),
    };
    if let Ok(expired) = HeaderValue::from_str(&sign_in::expired_cookie(&state)) {
        response.headers_mut().insert(header::SET_COOKIE, expired);
    }
    response
}
