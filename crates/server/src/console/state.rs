//! What every console page holds, and the page an operation's failure
//! shows.

use std::sync::Arc;

use axum::{
    http::StatusCode,
    response::{Html, IntoResponse, Response},
};

use super::html::{esc, page};
use crate::{GatewayState, admin::ops, http::auth::AuthState};

#[derive(Clone)]
pub(super) struct ConsoleState {
    pub gateway: Arc<GatewayState>,
    pub auth: AuthState,
}

pub(super) fn failed(error: ops::AdminError) -> Response {
    let status = match error {
        ops::AdminError::NotFound(_) => StatusCode::NOT_FOUND,
        ops::AdminError::Invalid(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    (
        status,
        Html(page(
            "Error",
            "overview",
            &format!(
                "<p class=\"error\" role=\"alert\">{}</p>",
                esc(&error.to_string())
            ),
        )),
    )
        .into_response()
}
