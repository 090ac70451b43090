//! The admin HTTP API: what an operator does without a shell on the gateway
//! host. Every route needs a gateway token with the `admin` action, whether or
//! not `/mcp` requires auth. Handlers are thin: the store does the work.

use axum::{
    Json, Router,
    body::Bytes,
    extract::{Path, Request, State},
    http::StatusCode,
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use manifold_broker::Caller;
use manifold_store::{Action, ApprovalError};
use serde::Deserialize;
use serde_json::json;

use crate::auth::{AuthState, bearer_caller};

pub(crate) fn routes(state: AuthState) -> Router {
    Router::new()
        .route("/admin/approvals", get(list_approvals))
        .route("/admin/approvals/{id}/approve", post(approve))
        .route("/admin/approvals/{id}/deny", post(deny))
        .layer(middleware::from_fn_with_state(state.clone(), require_admin))
        .with_state(state)
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({ "error": code, "message": message.into() })),
    )
        .into_response()
}

async fn require_admin(
    State(state): State<AuthState>,
    mut request: Request,
    next: Next,
) -> Response {
    let caller = match bearer_caller(&state, request.headers()).await {
        Ok(Some(caller)) => caller,
        Ok(None) => {
            return error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "an admin gateway token is required",
            );
        }
        Err(response) => return response,
    };
    if !caller
        .token
        .as_ref()
        .is_some_and(|t| t.allows(Action::Admin))
    {
        return error(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this token lacks the admin action",
        );
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

async fn list_approvals(State(state): State<AuthState>) -> Response {
    match state.governance.store().list_pending().await {
        Ok(pending) => Json(json!({ "approvals": pending })).into_response(),
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            e.to_string(),
        ),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    /// Who decided, for the record; defaults to the admin token.
    by: Option<String>,
}

async fn decide(
    state: AuthState,
    id: String,
    caller: Caller,
    body: Bytes,
    approve: bool,
) -> Response {
    // The body is optional: an empty one, with or without a JSON type, is `{}`.
    let body: DecisionBody = if body.iter().all(u8::is_ascii_whitespace) {
        DecisionBody::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(body) => body,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_body",
                    format!("expected {{\"by\": \"name\"}}: {e}"),
                );
            }
        }
    };
    let by = body
        .by
        .map(|by| format!("{by} ({})", caller.name))
        .unwrap_or(caller.name);
    match state
        .governance
        .store()
        .decide_approval(&id, approve, &by)
        .await
    {
        Ok(approval) => Json(json!(approval)).into_response(),
        Err(ApprovalError::NotFound) => error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no approval '{id}'"),
        ),
        Err(ApprovalError::Store(e)) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            e.to_string(),
        ),
        Err(e) => error(StatusCode::CONFLICT, "conflict", e.to_string()),
    }
}

async fn approve(
    State(state): State<AuthState>,
    Path(id): Path<String>,
    axum::Extension(caller): axum::Extension<Caller>,
    body: Bytes,
) -> Response {
    decide(state, id, caller, body, true).await
}

async fn deny(
    State(state): State<AuthState>,
    Path(id): Path<String>,
    axum::Extension(caller): axum::Extension<Caller>,
    body: Bytes,
) -> Response {
    decide(state, id, caller, body, false).await
}
