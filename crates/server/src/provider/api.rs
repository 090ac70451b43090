//! The HTTP surface for hosts that call a model API directly: `GET /export`,
//! `POST /search` and `POST /call`, behind the same authentication as
//! `/mcp`. Export and search are discovery, so they pass admission control;
//! a call does not. Handlers are thin: [`export`] and the broker do
//! the work.

use std::sync::Arc;

use axum::{
    Extension, Json, Router,
    extract::{Query, State},
    http::StatusCode,
    middleware,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use manifold_broker::Caller;
use manifold_export::Provider;
use rmcp::model::{CallToolResponse, JsonObject};
use serde::Deserialize;
use serde_json::json;

use super::export::{self, ExportError, ProviderSearch};
use crate::{
    GatewayState,
    http::auth::{AuthState, authenticate},
    mcp::call::brokered_call,
};

pub(crate) fn routes(state: Arc<GatewayState>, auth: AuthState) -> Router {
    Router::new()
        .route("/export", get(export))
        .route("/search", post(search))
        .route("/call", post(call))
        .layer(middleware::from_fn_with_state(auth, authenticate))
        .with_state(state)
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({ "error": code, "message": message.into() })),
    )
        .into_response()
}

fn export_error(e: ExportError) -> Response {
    match e {
        ExportError::Refused(refusal) => {
            (StatusCode::FORBIDDEN, Json(refusal.to_json())).into_response()
        }
        ExportError::Store(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            e.to_string(),
        ),
        ExportError::Search(e) => error(StatusCode::BAD_REQUEST, "invalid_query", e.to_string()),
    }
}

fn busy(state: &GatewayState) -> Response {
    let mut response = error(
        StatusCode::SERVICE_UNAVAILABLE,
        crate::BUSY_CODE,
        "too many discovery requests; retry later",
    );
    let retry = state.admission.config().retry_after.as_secs().max(1);
    if let Ok(value) = retry.to_string().parse() {
        response
            .headers_mut()
            .insert(axum::http::header::RETRY_AFTER, value);
    }
    response
}

#[derive(Deserialize)]
struct ExportQuery {
    format: String,
}

async fn export(
    State(state): State<Arc<GatewayState>>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<ExportQuery>,
) -> Response {
    let provider: Provider = match query.format.parse() {
        Ok(p) => p,
        Err(message) => return error(StatusCode::BAD_REQUEST, "invalid_format", message),
    };
    let Some(_admitted) = state.admission.admit().await else {
        return busy(&state);
    };
    match export::export(&state, &caller, provider).await {
        Ok(export) => Json(export).into_response(),
        Err(e) => export_error(e),
    }
}

async fn search(
    State(state): State<Arc<GatewayState>>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> Response {
    let request: ProviderSearch = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_body", e.to_string()),
    };
    let Some(_admitted) = state.admission.admit().await else {
        return busy(&state);
    };
    match export::search(&state, &caller, &request).await {
        Ok(result) => Json(result).into_response(),
        Err(e) => export_error(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CallBody {
    /// A qualified name, an Anthropic tool name, or an OpenAI function name
    /// (with `namespace`, or as `namespace.function`).
    name: String,
    namespace: Option<String>,
    /// An object, or a JSON string of one (as OpenAI sends `arguments`).
    arguments: Option<serde_json::Value>,
}

async fn call(
    State(state): State<Arc<GatewayState>>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> Response {
    let body: CallBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_body", e.to_string()),
    };
    let arguments: Option<JsonObject> = match body.arguments {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Object(map)) => Some(map),
        Some(serde_json::Value::String(text)) => match serde_json::from_str(&text) {
            Ok(map) => Some(map),
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_arguments",
                    format!("arguments is not a JSON object: {e}"),
                );
            }
        },
        Some(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_arguments",
                "arguments must be an object",
            );
        }
    };
    let view = state
        .catalog
        .view_for_call(&caller.principal, &body.name)
        .await;
    let qualified = export::resolve(&view, &body.name, body.namespace.as_deref())
        .unwrap_or_else(|| body.name.clone());
    // Calls run in their own task so a host that hangs up cannot abandon an
    // upstream call half-way or skip its audit row.
    let task_state = Arc::clone(&state);
    let tool = qualified.clone();
    let outcome = tokio::spawn(async move {
        brokered_call(&task_state, &caller, &tool, arguments, Default::default()).await
    })
    .await;
    match outcome {
        Ok(CallToolResponse::Complete(result)) => {
            Json(json!({ "tool": qualified, "result": result })).into_response()
        }
        Ok(_) => error(
            StatusCode::NOT_IMPLEMENTED,
            "input_required",
            "the tool asked for client input, which POST /call cannot relay; use /mcp",
        ),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "call_failed",
            e.to_string(),
        ),
    }
}
