//! The admin HTTP API under `/admin`: what an operator does without a shell
//! on the gateway host. Every route but the OpenAPI document needs a gateway
//! token with the `admin` action, whether or not `/mcp` requires auth: as a
//! bearer, or as the console's sign-in cookie. Handlers are thin: [`ops`]
//! does the work, for the console and the CLI too.

pub(crate) mod openapi;
pub mod ops;

use std::{convert::Infallible, sync::Arc, time::Duration};

use axum::{
    Json, Router,
    body::Bytes,
    extract::{Path, Query, Request, State},
    http::{HeaderMap, Method, StatusCode, header},
    middleware::{self, Next},
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
    routing::{get, post},
};
use futures::{Stream, StreamExt};
use manifold_broker::Caller;
use manifold_search::Strategy;
use manifold_store::{Action, RiskTier};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use utoipa::{IntoParams, ToSchema};

use crate::{GatewayState, http::auth::AuthState};
use ops::AdminError;
pub use ops::{ServerEntry, ServerFile};

/// Sent by the console's scripts: a cookie-authenticated request that
/// changes anything must carry it, which a cross-site form cannot.
pub(crate) const CONSOLE_HEADER: &str = "x-manifold-console";
/// How often the approvals stream re-reads the store (which other gateway
/// processes may write).
const APPROVALS_POLL: Duration = Duration::from_millis(300);

#[derive(Clone)]
pub(crate) struct AdminState {
    pub gateway: Arc<GatewayState>,
    pub auth: AuthState,
    /// Ends the approvals streams, so that they do not hold a shutdown's drain.
    pub shutdown: CancellationToken,
}

pub(crate) fn routes(
    gateway: Arc<GatewayState>,
    auth: AuthState,
    shutdown: CancellationToken,
) -> Router {
    let state = AdminState {
        gateway,
        auth,
        shutdown,
    };
    Router::new()
        .route("/admin/overview", get(overview))
        .route("/admin/servers", get(list_servers).post(add_server))
        .route(
            "/admin/servers/{name}",
            get(get_server).delete(remove_server),
        )
        .route("/admin/servers/{name}/enable", post(enable_server))
        .route("/admin/servers/{name}/disable", post(disable_server))
        .route("/admin/servers/{name}/sign-in", post(sign_in_server))
        .route("/admin/tools", get(list_tools))
        .route("/admin/tools/{server}/{tool}", get(get_tool))
        .route("/admin/tools/{server}/{tool}/approve", post(approve_tool))
        .route(
            "/admin/tools/{server}/{tool}/quarantine",
            post(quarantine_tool),
        )
        .route("/admin/tools/{server}/{tool}/classify", post(classify_tool))
        .route("/admin/search", get(search))
        .route("/admin/tokens", get(list_tokens).post(create_token))
        .route("/admin/tokens/{id}/revoke", post(revoke_token))
        .route("/admin/policies", get(list_policies).post(create_policy))
        .route(
            "/admin/policies/{id}",
            axum::routing::put(update_policy).delete(delete_policy),
        )
        .route("/admin/approvals", get(list_approvals))
        .route("/admin/approvals/events", get(approval_events))
        .route("/admin/approvals/{id}/approve", post(approve))
        .route("/admin/approvals/{id}/deny", post(deny))
        .route("/admin/audit", get(audit))
        .route("/admin/audit/export", get(audit_export))
        .layer(middleware::from_fn_with_state(state.clone(), require_admin))
        .with_state(state)
}

/// The error body of every admin route.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// `unauthorized`, `forbidden`, `invalid`, `not_found`, `conflict`,
    /// `upstream_failed` or `store_unavailable`.
    pub error: String,
    pub message: String,
}

pub(crate) fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(ErrorBody {
            error: code.to_string(),
            message: message.into(),
        }),
    )
        .into_response()
}

/// An operation's failure as the API answers it: its status code and
/// `error` code (the operations crate knows nothing of HTTP).
pub(crate) struct ApiError(AdminError);

impl From<AdminError> for ApiError {
    fn from(error: AdminError) -> Self {
        ApiError(error)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let ApiError(failure) = self;
        let (status, code) = match &failure {
            AdminError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid"),
            AdminError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            AdminError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            AdminError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            AdminError::Upstream(_) => (StatusCode::BAD_GATEWAY, "upstream_failed"),
            AdminError::Store(_) => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
        };
        error(status, code, failure.to_string())
    }
}

type ApiResult<T> = Result<Json<T>, ApiError>;

/// The value of cookie `name`, if the request sent it.
pub(crate) fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The admin caller of a request (bearer first, then the console cookie),
/// or the response refusing it.
pub(crate) async fn admin_caller(
    state: &AuthState,
    headers: &HeaderMap,
) -> Result<(Caller, bool), Response> {
    let sessions = &state.auth.console;
    let (caller, by_cookie) = match crate::http::auth::bearer_caller(state, headers).await? {
        Some((caller, _rows)) => (caller, false),
        None => match cookie(headers, sessions.cookie_name()).filter(|t| !t.is_empty()) {
            Some(id) => {
                let idle = i64::try_from(sessions.idle.as_millis()).unwrap_or(i64::MAX);
                match state
                    .governance
                    .store()
                    .console_session(id, manifold_store::now_ms(), idle)
                    .await
                {
                    Ok(Some(token)) => (Caller::with_token(token), true),
                    Ok(None) => {
                        return Err(error(
                            StatusCode::UNAUTHORIZED,
                            "unauthorized",
                            "the console session has ended; sign in again",
                        ));
                    }
                    Err(e) => {
                        return Err(error(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "store_unavailable",
                            format!("the store is unavailable: {e}"),
                        ));
                    }
                }
            }
            None => {
                return Err(error(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "an admin gateway token is required",
                ));
            }
        },
    };
    if (caller.token.is_none() && caller.user.is_none()) || !caller.may(Action::Admin) {
        return Err(error(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this token lacks the admin action",
        ));
    }
    Ok((caller, by_cookie))
}

async fn require_admin(
    State(state): State<AdminState>,
    mut request: Request,
    next: Next,
) -> Response {
    let (caller, by_cookie) = match admin_caller(&state.auth, request.headers()).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let safe = matches!(*request.method(), Method::GET | Method::HEAD);
    if by_cookie && !safe && !request.headers().contains_key(CONSOLE_HEADER) {
        return error(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("a console request that changes state needs the {CONSOLE_HEADER} header"),
        );
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// A JSON body that may be empty (`{}`).
fn optional_body<T: for<'de> Deserialize<'de> + Default>(body: &Bytes) -> Result<T, AdminError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| AdminError::Invalid(format!("invalid body: {e}")))
}

fn json_body<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, AdminError> {
    serde_json::from_slice(body).map_err(|e| AdminError::Invalid(format!("invalid body: {e}")))
}

// ------------------------------------------------------------------ routes

/// Mode, counts, queue depth and every server.
#[utoipa::path(get, path = "/admin/overview", tag = "servers",
    responses((status = 200, body = ops::Overview), (status = 401, body = ErrorBody)))]
async fn overview(State(s): State<AdminState>) -> ApiResult<ops::Overview> {
    Ok(Json(ops::overview(&s.gateway).await?))
}

#[derive(Serialize, ToSchema)]
pub struct ServerList {
    pub servers: Vec<ops::ServerInfo>,
}

/// Every configured server with its state.
#[utoipa::path(get, path = "/admin/servers", tag = "servers",
    responses((status = 200, body = ServerList)))]
async fn list_servers(State(s): State<AdminState>) -> Json<ServerList> {
    Json(ServerList {
        servers: ops::servers(&s.gateway).await,
    })
}

/// Add a server for the life of this process, or with `persist` to this
/// replica's config file as well. Needs `[admin] allow_runtime_servers`; a
/// command must match `allowed_commands`, a URL be public or in `allowed_hosts`.
#[utoipa::path(post, path = "/admin/servers", tag = "servers", request_body = ops::AddServer,
    responses((status = 201, body = ops::ServerInfo), (status = 400, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn add_server(
    State(s): State<AdminState>,
    body: Bytes,
) -> Result<(StatusCode, Json<ops::ServerInfo>), ApiError> {
    let add: ops::AddServer = json_body(&body)?;
    Ok((
        StatusCode::CREATED,
        Json(ops::add_server(&s.gateway, add).await?),
    ))
}

#[utoipa::path(get, path = "/admin/servers/{name}", tag = "servers",
    params(("name" = String, Path)),
    responses((status = 200, body = ops::ServerInfo), (status = 404, body = ErrorBody)))]
async fn get_server(
    State(s): State<AdminState>,
    Path(name): Path<String>,
) -> ApiResult<ops::ServerInfo> {
    Ok(Json(ops::server(&s.gateway, &name).await?))
}

/// Remove a server from this replica's config file, and so from the running
/// gateway (calls in flight finish first). Needs `[admin] allow_runtime_servers`.
#[utoipa::path(delete, path = "/admin/servers/{name}", tag = "servers",
    params(("name" = String, Path)),
    responses((status = 200, body = Deleted), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn remove_server(
    State(s): State<AdminState>,
    Path(name): Path<String>,
) -> ApiResult<Deleted> {
    ops::remove_server(&s.gateway, &name).await?;
    Ok(Json(Deleted { deleted: name }))
}

/// Connect a server and list its tools.
#[utoipa::path(post, path = "/admin/servers/{name}/enable", tag = "servers",
    params(("name" = String, Path)),
    responses((status = 200, body = ops::ServerInfo), (status = 404, body = ErrorBody),
              (status = 502, body = ErrorBody)))]
async fn enable_server(
    State(s): State<AdminState>,
    Path(name): Path<String>,
) -> ApiResult<ops::ServerInfo> {
    Ok(Json(ops::set_enabled(&s.gateway, &name, true).await?))
}

/// Where a person signs the gateway in to an `auth = "oauth"` server: the
/// authorization URL to open (its callback is `<public_url>/oauth/callback`).
#[utoipa::path(post, path = "/admin/servers/{name}/sign-in", tag = "servers",
    params(("name" = String, Path)),
    responses((status = 200, body = SignIn), (status = 400, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 502, body = ErrorBody)))]
async fn sign_in_server(
    State(s): State<AdminState>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult<SignIn> {
    let base = crate::http::auth::public_base(&s.auth.auth, &headers);
    Ok(Json(SignIn {
        url: ops::begin_sign_in(&s.gateway, &name, &base).await?,
    }))
}

/// A sign-in to start in a browser.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct SignIn {
    pub url: String,
}

/// Disconnect a server and drop its tools.
#[utoipa::path(post, path = "/admin/servers/{name}/disable", tag = "servers",
    params(("name" = String, Path)),
    responses((status = 200, body = ops::ServerInfo), (status = 404, body = ErrorBody)))]
async fn disable_server(
    State(s): State<AdminState>,
    Path(name): Path<String>,
) -> ApiResult<ops::ServerInfo> {
    Ok(Json(ops::set_enabled(&s.gateway, &name, false).await?))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ToolsQuery {
    /// Only this server's tools.
    pub server: Option<String>,
    /// A substring of the name or description.
    pub q: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct ToolList {
    pub tools: Vec<ops::ToolSummary>,
}

/// The catalog: every tool of the enabled servers, with tier and quarantine.
#[utoipa::path(get, path = "/admin/tools", tag = "catalog", params(ToolsQuery),
    responses((status = 200, body = ToolList)))]
async fn list_tools(
    State(s): State<AdminState>,
    Query(q): Query<ToolsQuery>,
) -> ApiResult<ToolList> {
    let tools = ops::tools(&s.gateway, q.server.as_deref(), q.q.as_deref()).await?;
    Ok(Json(ToolList { tools }))
}

/// One tool: definition, TypeScript stub, annotations, tier, hash, quarantine.
#[utoipa::path(get, path = "/admin/tools/{server}/{tool}", tag = "catalog",
    params(("server" = String, Path), ("tool" = String, Path)),
    responses((status = 200, body = ops::ToolDetail), (status = 404, body = ErrorBody)))]
async fn get_tool(
    State(s): State<AdminState>,
    Path((server, tool)): Path<(String, String)>,
) -> ApiResult<ops::ToolDetail> {
    Ok(Json(ops::tool(&s.gateway, &server, &tool).await?))
}

/// A tool's stored record after an operator's action.
#[derive(Serialize, ToSchema)]
pub struct ToolRecord {
    pub server: String,
    pub tool: String,
    pub definition_hash: String,
    /// The operator's tier, if set.
    pub tier: Option<String>,
    /// `approved` or `quarantined`.
    pub status: String,
    pub approved_hash: Option<String>,
}

impl From<manifold_store::ToolClassification> for ToolRecord {
    fn from(c: manifold_store::ToolClassification) -> Self {
        ToolRecord {
            server: c.server,
            tool: c.tool,
            definition_hash: c.definition_hash,
            tier: c.tier.map(|t| t.as_str().to_string()),
            status: c.status.as_str().to_string(),
            approved_hash: c.approved_hash,
        }
    }
}

async fn tool_action(
    s: &AdminState,
    server: &str,
    tool: &str,
    action: ops::ToolAction,
) -> ApiResult<ToolRecord> {
    let store = s.gateway.governance().store();
    Ok(Json(
        ops::tool_action(store, server, tool, action).await?.into(),
    ))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApproveToolBody {
    /// The definition hash the operator reviewed (full, or its first 12+
    /// digits).
    pub hash: String,
}

/// Approve the definition the operator reviewed, lifting quarantine. 409
/// when the definition has changed since (the answer names both hashes).
#[utoipa::path(post, path = "/admin/tools/{server}/{tool}/approve", tag = "catalog",
    params(("server" = String, Path), ("tool" = String, Path)), request_body = ApproveToolBody,
    responses((status = 200, body = ToolRecord), (status = 400, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn approve_tool(
    State(s): State<AdminState>,
    Path((server, tool)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<ToolRecord> {
    let body: ApproveToolBody = serde_json::from_slice(&body).map_err(|e| {
        AdminError::Invalid(format!(
            "invalid body: {e}; send {{\"hash\": \"<the definition hash you reviewed>\"}}"
        ))
    })?;
    let action = ops::ToolAction::Approve {
        reviewed_hash: body.hash,
    };
    tool_action(&s, &server, &tool, action).await
}

/// Quarantine the tool: hidden and blocked until approved.
#[utoipa::path(post, path = "/admin/tools/{server}/{tool}/quarantine", tag = "catalog",
    params(("server" = String, Path), ("tool" = String, Path)),
    responses((status = 200, body = ToolRecord), (status = 404, body = ErrorBody)))]
async fn quarantine_tool(
    State(s): State<AdminState>,
    Path((server, tool)): Path<(String, String)>,
) -> ApiResult<ToolRecord> {
    tool_action(&s, &server, &tool, ops::ToolAction::Quarantine).await
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClassifyBody {
    /// `read_only`, `write`, `destructive`, or null to use the annotations.
    pub tier: Option<String>,
}

/// Set the tool's risk tier.
#[utoipa::path(post, path = "/admin/tools/{server}/{tool}/classify", tag = "catalog",
    params(("server" = String, Path), ("tool" = String, Path)), request_body = ClassifyBody,
    responses((status = 200, body = ToolRecord), (status = 400, body = ErrorBody)))]
async fn classify_tool(
    State(s): State<AdminState>,
    Path((server, tool)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<ToolRecord> {
    let body: ClassifyBody = json_body(&body)?;
    let tier = match body
        .tier
        .as_deref()
        .filter(|t| !t.is_empty() && *t != "none")
    {
        None => None,
        Some(t) => Some(t.parse::<RiskTier>().map_err(AdminError::from)?),
    };
    tool_action(&s, &server, &tool, ops::ToolAction::Classify(tier)).await
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SearchQuery {
    pub query: String,
    /// Comma-separated: `bm25`, `regex`, `embedding`, `hybrid`, `rerank`.
    /// Default: `bm25,hybrid`.
    pub strategies: Option<String>,
    pub limit: Option<usize>,
}

/// Parses `bm25,regex`.
pub(crate) fn parse_strategies(text: Option<&str>) -> Result<Vec<Strategy>, AdminError> {
    text.unwrap_or("bm25,hybrid")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .map_err(|e: manifold_search::SearchError| AdminError::Invalid(e.to_string()))
        })
        .collect()
}

/// Search the whole catalog with several strategies, side by side.
#[utoipa::path(get, path = "/admin/search", tag = "search", params(SearchQuery),
    responses((status = 200, body = ops::SearchComparison), (status = 400, body = ErrorBody)))]
async fn search(
    State(s): State<AdminState>,
    Query(q): Query<SearchQuery>,
) -> ApiResult<ops::SearchComparison> {
    let strategies = parse_strategies(q.strategies.as_deref())?;
    Ok(Json(
        ops::compare_search(&s.gateway, &q.query, &strategies, q.limit.unwrap_or(8)).await?,
    ))
}

#[derive(Serialize, ToSchema)]
pub struct TokenList {
    pub tokens: Vec<ops::TokenInfo>,
}

/// Every token; secrets are never stored, so never shown.
#[utoipa::path(get, path = "/admin/tokens", tag = "tokens",
    responses((status = 200, body = TokenList)))]
async fn list_tokens(State(s): State<AdminState>) -> ApiResult<TokenList> {
    let tokens = ops::list_tokens(s.gateway.governance().store()).await?;
    Ok(Json(TokenList { tokens }))
}

/// Create a token. The response holds its secret, this once.
#[utoipa::path(post, path = "/admin/tokens", tag = "tokens", request_body = ops::CreateToken,
    responses((status = 201, body = ops::CreatedToken), (status = 400, body = ErrorBody)))]
async fn create_token(
    State(s): State<AdminState>,
    body: Bytes,
) -> Result<(StatusCode, Json<ops::CreatedToken>), ApiError> {
    let request: ops::CreateToken = json_body(&body)?;
    let created = ops::create_token(s.gateway.governance().store(), request).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Revoke a token now; its next request is refused.
#[utoipa::path(post, path = "/admin/tokens/{id}/revoke", tag = "tokens",
    params(("id" = String, Path)),
    responses((status = 200, body = ops::TokenInfo), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody)))]
async fn revoke_token(
    State(s): State<AdminState>,
    Path(id): Path<String>,
) -> ApiResult<ops::TokenInfo> {
    Ok(Json(
        ops::revoke_token(s.gateway.governance().store(), &id).await?,
    ))
}

#[derive(Serialize, ToSchema)]
pub struct PolicyList {
    pub policies: Vec<ops::PolicyInfo>,
}

/// Every rule, oldest first.
#[utoipa::path(get, path = "/admin/policies", tag = "policies",
    responses((status = 200, body = PolicyList)))]
async fn list_policies(State(s): State<AdminState>) -> ApiResult<PolicyList> {
    let policies = ops::list_policies(s.gateway.governance().store()).await?;
    Ok(Json(PolicyList { policies }))
}

/// Add a rule; it applies to the next call.
#[utoipa::path(post, path = "/admin/policies", tag = "policies", request_body = ops::PolicyInput,
    responses((status = 201, body = ops::PolicyInfo), (status = 400, body = ErrorBody)))]
async fn create_policy(
    State(s): State<AdminState>,
    body: Bytes,
) -> Result<(StatusCode, Json<ops::PolicyInfo>), ApiError> {
    let input: ops::PolicyInput = json_body(&body)?;
    let policy = ops::create_policy(s.gateway.governance().store(), &input).await?;
    Ok((StatusCode::CREATED, Json(policy)))
}

/// Replace a rule's contents.
#[utoipa::path(put, path = "/admin/policies/{id}", tag = "policies",
    params(("id" = String, Path)), request_body = ops::PolicyInput,
    responses((status = 200, body = ops::PolicyInfo), (status = 404, body = ErrorBody)))]
async fn update_policy(
    State(s): State<AdminState>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<ops::PolicyInfo> {
    let input: ops::PolicyInput = json_body(&body)?;
    Ok(Json(
        ops::update_policy(s.gateway.governance().store(), &id, &input).await?,
    ))
}

#[derive(Serialize, ToSchema)]
pub struct Deleted {
    pub deleted: String,
}

/// Delete a rule.
#[utoipa::path(delete, path = "/admin/policies/{id}", tag = "policies",
    params(("id" = String, Path)),
    responses((status = 200, body = Deleted), (status = 404, body = ErrorBody)))]
async fn delete_policy(State(s): State<AdminState>, Path(id): Path<String>) -> ApiResult<Deleted> {
    ops::delete_policy(s.gateway.governance().store(), &id).await?;
    Ok(Json(Deleted { deleted: id }))
}

#[derive(Serialize, ToSchema)]
pub struct ApprovalList {
    pub approvals: Vec<ops::ApprovalInfo>,
}

/// Pending, unexpired approval requests, oldest first.
#[utoipa::path(get, path = "/admin/approvals", tag = "approvals",
    responses((status = 200, body = ApprovalList)))]
async fn list_approvals(State(s): State<AdminState>) -> ApiResult<ApprovalList> {
    let approvals = ops::pending_approvals(s.gateway.governance().store()).await?;
    Ok(Json(ApprovalList { approvals }))
}

/// Server-sent events: an `approvals` event with the pending list (as
/// `GET /admin/approvals` returns it) now and whenever it changes.
#[utoipa::path(get, path = "/admin/approvals/events", tag = "approvals",
    responses((status = 200, content_type = "text/event-stream", body = String)))]
async fn approval_events(
    State(s): State<AdminState>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let store = s.gateway.governance().store().clone();
    let stream = futures::stream::unfold((store, None::<String>), |(store, last)| async move {
        loop {
            if last.is_some() {
                tokio::time::sleep(APPROVALS_POLL).await;
            }
            let data = match ops::pending_approvals(&store).await {
                Ok(approvals) => json!({ "approvals": approvals }).to_string(),
                // Said once, then retried at the next poll.
                Err(e) => json!({ "error": e.to_string() }).to_string(),
            };
            if last.as_deref() != Some(&data) {
                let event = Event::default().event("approvals").data(data.clone());
                return Some((Ok(event), (store, Some(data))));
            }
        }
    });
    Sse::new(stream.take_until(s.shutdown.cancelled_owned())).keep_alive(KeepAlive::default())
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    /// Who decided, for the record; defaults to the admin token.
    pub by: Option<String>,
}

async fn decide(
    s: AdminState,
    id: String,
    caller: Caller,
    body: Bytes,
    approve: bool,
) -> ApiResult<ops::ApprovalInfo> {
    let body: DecisionBody = optional_body(&body)?;
    let by = body
        .by
        .map(|by| format!("{by} ({})", caller.name))
        .unwrap_or_else(|| caller.name.clone());
    Ok(Json(
        ops::decide_approval(
            s.gateway.governance().store(),
            &id,
            approve,
            &by,
            Some(&caller.name),
        )
        .await?,
    ))
}

/// Approve a pending request; the waiting call goes ahead. The principal
/// that made the request cannot approve it (403).
#[utoipa::path(post, path = "/admin/approvals/{id}/approve", tag = "approvals",
    params(("id" = String, Path)), request_body = Option<DecisionBody>,
    responses((status = 200, body = ops::ApprovalInfo), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn approve(
    State(s): State<AdminState>,
    Path(id): Path<String>,
    axum::Extension(caller): axum::Extension<Caller>,
    body: Bytes,
) -> ApiResult<ops::ApprovalInfo> {
    decide(s, id, caller, body, true).await
}

/// Deny a pending request; the waiting call fails with `approval_denied`.
#[utoipa::path(post, path = "/admin/approvals/{id}/deny", tag = "approvals",
    params(("id" = String, Path)), request_body = Option<DecisionBody>,
    responses((status = 200, body = ops::ApprovalInfo), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody)))]
async fn deny(
    State(s): State<AdminState>,
    Path(id): Path<String>,
    axum::Extension(caller): axum::Extension<Caller>,
    body: Bytes,
) -> ApiResult<ops::ApprovalInfo> {
    decide(s, id, caller, body, false).await
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// `discovery`, `access` or `activity`; default all three, merged by time.
    pub kind: Option<String>,
    /// How many of the last rows (default 50, at most 1000).
    pub n: Option<usize>,
}

#[derive(Serialize, ToSchema)]
pub struct AuditList {
    /// The store's rows, unchanged.
    #[schema(value_type = Vec<ops::AuditRow>)]
    pub rows: Vec<serde_json::Value>,
}

/// The last rows of the audit trails, oldest first.
#[utoipa::path(get, path = "/admin/audit", tag = "audit", params(AuditQuery),
    responses((status = 200, body = AuditList), (status = 400, body = ErrorBody)))]
async fn audit(State(s): State<AdminState>, Query(q): Query<AuditQuery>) -> ApiResult<AuditList> {
    let kinds = ops::audit_kinds(q.kind.as_deref())?;
    let n = q.n.unwrap_or(50).clamp(1, 1000);
    let rows = ops::audit_tail(s.gateway.governance().store(), &kinds, n).await?;
    Ok(Json(AuditList { rows }))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExportQuery {
    pub kind: Option<String>,
    /// A span back from now (`1h`, `7d`) or unix milliseconds; default everything.
    pub since: Option<String>,
}

/// Every row since a time as JSON lines (one `AuditRow` per line).
#[utoipa::path(get, path = "/admin/audit/export", tag = "audit", params(ExportQuery),
    responses((status = 200, content_type = "application/x-ndjson", body = String),
              (status = 400, body = ErrorBody)))]
async fn audit_export(
    State(s): State<AdminState>,
    Query(q): Query<ExportQuery>,
) -> Result<Response, ApiError> {
    let kinds = ops::audit_kinds(q.kind.as_deref())?;
    let since = ops::parse_since(q.since.as_deref())?;
    let rows = ops::audit_export(s.gateway.governance().store(), &kinds, since).await?;
    let mut out = String::new();
    for row in rows {
        out.push_str(&row.to_string());
        out.push('\n');
    }
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"manifold-audit.jsonl\"",
            ),
        ],
        out,
    )
        .into_response())
}
