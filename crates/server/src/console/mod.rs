//! The operator console at `/console`: server-rendered HTML pages over the
//! same [`crate::admin::ops`] functions as the admin API, plus one small
//! script (`console.js`) that sends the pages' forms to the admin API and
//! listens to the approvals stream. Nothing is loaded from elsewhere.
//!
//! Sign-in trades an admin token for an HttpOnly, SameSite=Strict cookie;
//! the admin API accepts that cookie, and asks the console's header on
//! anything that changes state (see [`crate::admin`]).

mod catalog;
mod chart;
pub(crate) mod html;
mod playground;
mod schema_form;
mod servers;
mod session;
mod state;

use std::{fmt::Write, sync::Arc};

use axum::{
    Router,
    extract::{Path, Query, State},
    http::StatusCode,
    middleware,
    response::{Html, IntoResponse, Response},
    routing::{get, post},
};
use serde::Deserialize;
use serde_json::Value;

use crate::{GatewayState, admin::ops, http::auth::AuthState};
use html::{action, badge, esc, json_block, page, rows_html, table, url};
use state::{ConsoleState, failed};

pub(crate) fn routes(gateway: Arc<GatewayState>, auth: AuthState) -> Router {
    let state = ConsoleState { gateway, auth };
    let pages = Router::new()
        .route("/console", get(overview))
        .route("/console/catalog", get(catalog::catalog))
        .route("/console/tools/{server}/{tool}", get(catalog::tool_page))
        .route("/console/search", get(catalog::search))
        .route("/console/playground", get(playground::show))
        .route("/console/playground/call", post(playground::call))
        .route("/console/servers/{name}", get(servers::show))
        .route("/console/servers/{name}/sign-in", get(sign_in))
        .route("/console/tokens", get(tokens))
        .route("/console/policies", get(policies))
        .route("/console/approvals", get(approvals))
        .route("/console/approvals/rows", get(approval_rows))
        .route("/console/audit", get(audit))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            session::signed_in,
        ))
        .with_state(state.clone());
    Router::new()
        .route(
            "/console/login",
            get(session::login_page).post(session::login),
        )
        .route("/console/logout", post(session::logout))
        .route("/console/assets/console.js", get(session::script))
        .route("/console/assets/console.css", get(session::style))
        .with_state(state)
        .merge(pages)
        .layer(middleware::map_response(session::security_headers))
}

fn stat(label: &str, value: impl std::fmt::Display, id: &str) -> String {
    format!(
        "<div class=\"stat\"><span class=\"label\">{}</span><span class=\"value\" id=\"{id}\">{}</span></div>",
        esc(label),
        esc(&value.to_string())
    )
}

async fn overview(State(state): State<ConsoleState>) -> Response {
    let o = match ops::overview(&state.gateway).await {
        Ok(o) => o,
        Err(e) => return failed(e),
    };
    let stats = [
        stat("mode", &o.mode, "stat-mode"),
        stat("servers", o.servers.len(), "stat-servers"),
        stat("tools", o.tools, "stat-tools"),
        stat("definition tokens", o.definition_tokens, "stat-tokens"),
        stat("pending approvals", o.pending_approvals, "stat-approvals"),
        stat("discovery queue", o.discovery_queue, "stat-queue"),
    ]
    .concat();
    let rows: Vec<Vec<String>> = o
        .servers
        .iter()
        .map(|s| {
            let toggle = if s.enabled {
                action(
                    "POST",
                    &format!("/admin/servers/{}/disable", url(&s.name)),
                    "Disable",
                    "secondary",
                )
            } else {
                action(
                    "POST",
                    &format!("/admin/servers/{}/enable", url(&s.name)),
                    "Enable",
                    "",
                )
            };
            let mut state_cell = badge(&s.state);
            if s.stale {
                state_cell.push_str(&badge("stale"));
            }
            if let Some(error) = &s.error {
                let _ = write!(state_cell, "<div class=\"hint\">{}</div>", esc(error));
            }
            if let Some(open) = s.principal_connections {
                let _ = write!(
                    state_cell,
                    "<div class=\"hint\">each caller signs in for itself; {open} caller connection(s) open</div>"
                );
            }
            if s.state == "needs_sign_in" {
                let _ = write!(
                    state_cell,
                    "<a class=\"button\" href=\"/console/servers/{}/sign-in\">Sign in</a>",
                    url(&s.name)
                );
            }
            vec![
                format!(
                    "<a href=\"/console/catalog?server={}\">{}</a><div class=\"hint\">{}</div>",
                    url(&s.name),
                    esc(&s.name),
                    esc(&s.description)
                ),
                state_cell,
                s.tools.to_string(),
                s.definition_tokens.to_string(),
                esc(&s.transport),
                format!(
                    "<div class=\"actions\">{toggle}<a class=\"button secondary\" href=\"/console/servers/{}\">Activity</a></div>",
                    url(&s.name)
                ),
            ]
        })
        .collect();
    let body = format!(
        "<section class=\"stats\">{stats}</section>\
         <p class=\"hint\">search strategy <b>{}</b> · code mode <b>{}</b> · auth {}</p>\
         <h2>Servers</h2>{}<p class=\"status\" role=\"status\"></p>{}",
        esc(&o.search_strategy),
        if o.code_mode { "on" } else { "off" },
        if o.auth_required {
            "required"
        } else {
            "optional"
        },
        table(
            &["server", "state", "tools", "def. tokens", "transport", ""],
            &rows,
            "servers"
        ),
        servers::add_form(&state.gateway.config.runtime_servers),
    );
    Html(page("Overview", "overview", &body)).into_response()
}

async fn tokens(State(state): State<ConsoleState>) -> Response {
    let tokens = match ops::list_tokens(state.gateway.governance().store()).await {
        Ok(t) => t,
        Err(e) => return failed(e),
    };
    let rows: Vec<Vec<String>> = tokens
        .iter()
        .map(|t| {
            let revoke = if t.state == "active" {
                action(
                    "POST",
                    &format!("/admin/tokens/{}/revoke", url(&t.id)),
                    "Revoke",
                    "danger",
                )
            } else {
                String::new()
            };
            vec![
                format!("<code>{}</code>", esc(&t.id)),
                esc(&t.name),
                esc(&t.actions.join(", ")),
                esc(&t.scopes.join(", ")),
                esc(&t.groups.join(", ")),
                esc(&t.expires),
                badge(&t.state),
                revoke,
            ]
        })
        .collect();
    let mut actions = String::new();
    for a in ["discover", "call", "code", "admin"] {
        let checked = if a == "admin" { "" } else { " checked" };
        let _ = write!(
            actions,
            "<label class=\"check\"><input type=\"checkbox\" name=\"actions\" value=\"{a}\"{checked}>{a}</label>"
        );
    }
    let body = format!(
        "<form class=\"card\" data-api=\"POST /admin/tokens\" data-then=\"secret\" id=\"create-token\">\
         <h2>New token</h2><label>name <input name=\"name\" required></label>\
         <label>expires <input name=\"expires\" value=\"30d\" placeholder=\"30d, 12h, never\"></label>\
         <label>scopes <input name=\"scopes\" data-list placeholder=\"* or github__*, comma-separated\"></label>\
         <label>groups <input name=\"groups\" data-list placeholder=\"comma-separated\"></label>\
         <fieldset><legend>actions</legend>{actions}</fieldset><button>Create token</button>\
         <div class=\"secret\" id=\"secret\" hidden><p>Copy this token now: it will not be shown again.</p>\
         <code class=\"wrap\" id=\"secret-value\"></code></div></form>\
         <p class=\"status\" role=\"status\"></p>{}",
        table(
            &[
                "id", "name", "actions", "scopes", "groups", "expires", "state", ""
            ],
            &rows,
            "tokens"
        )
    );
    Html(page("Tokens", "tokens", &body)).into_response()
}

#[derive(Deserialize)]
struct PoliciesQuery {
    /// The rule whose contents the form edits.
    edit: Option<String>,
}

fn selected_options(values: &[&str], chosen: &str) -> String {
    values
        .iter()
        .map(|v| {
            let selected = if *v == chosen { " selected" } else { "" };
            format!("<option{selected}>{v}</option>")
        })
        .collect()
}

/// The rule form: a new rule, or with `editing` that rule's contents,
/// replaced as a whole (`PUT /admin/policies/{id}`).
fn policy_form(editing: Option<&ops::PolicyInfo>) -> String {
    let value = |f: fn(&ops::PolicyInfo) -> String, default: &str| {
        editing.map_or_else(|| default.to_string(), f)
    };
    let (api, title, button, cancel) = match editing {
        Some(p) => (
            format!("PUT /admin/policies/{}", url(&p.id)),
            format!("Edit rule <code>{}</code>", esc(&p.id)),
            "Save rule",
            "<a class=\"button secondary\" href=\"/console/policies\">Cancel</a>",
        ),
        None => (
            "POST /admin/policies".to_string(),
            "New rule".to_string(),
            "Add rule",
            "",
        ),
    };
    let number = |n: Option<u32>| n.map(|n| n.to_string()).unwrap_or_default();
    format!(
        "<form class=\"card grid\" data-api=\"{}\" data-go=\"/console/policies\" id=\"{}\"><h2>{title}</h2>\
         <label>effect <select name=\"effect\">{}</select></label>\
         <label>principal <input name=\"principal\" value=\"{}\" placeholder=\"*, token:ID, group:G\"></label>\
         <label>server <input name=\"server\" value=\"{}\"></label>\
         <label>tool <input name=\"tool\" value=\"{}\"></label>\
         <label>tier <select name=\"tier\">{}</select></label>\
         <label>limit <input name=\"limit\" type=\"number\" min=\"1\" value=\"{}\" placeholder=\"rate_limit only\"></label>\
         <label>window (s) <input name=\"window_seconds\" type=\"number\" min=\"1\" value=\"{}\" placeholder=\"rate_limit only\"></label>\
         <label>description <input name=\"description\" value=\"{}\"></label><button>{button}</button>{cancel}</form>",
        esc(&api),
        if editing.is_some() {
            "edit-policy"
        } else {
            "add-policy"
        },
        selected_options(
            &["deny", "require_approval", "allow", "rate_limit"],
            &value(|p| p.effect.clone(), "deny")
        ),
        esc(&value(|p| p.principal.clone(), "*")),
        esc(&value(|p| p.server.clone(), "*")),
        esc(&value(|p| p.tool.clone(), "*")),
        selected_options(
            &["any", "read_only", "write", "destructive"],
            &value(|p| p.tier.clone(), "any")
        ),
        number(editing.and_then(|p| p.limit)),
        number(editing.and_then(|p| p.window_seconds)),
        esc(&value(|p| p.description.clone(), "")),
    )
}

async fn policies(State(state): State<ConsoleState>, Query(q): Query<PoliciesQuery>) -> Response {
    let policies = match ops::list_policies(state.gateway.governance().store()).await {
        Ok(p) => p,
        Err(e) => return failed(e),
    };
    let editing = match q.edit.as_deref().filter(|id| !id.is_empty()) {
        Some(id) => match policies.iter().find(|p| p.id == id) {
            Some(p) => Some(p),
            None => {
                return failed(ops::AdminError::NotFound(format!(
                    "no policy with id '{id}'"
                )));
            }
        },
        None => None,
    };
    let rows: Vec<Vec<String>> = policies
        .iter()
        .map(|p| {
            let effect = match (p.limit, p.window_seconds) {
                (Some(limit), Some(window)) => format!("{} {limit}/{window}s", esc(&p.effect)),
                _ => badge(&p.effect),
            };
            vec![
                format!("<code>{}</code>", esc(&p.id)),
                esc(&p.principal),
                esc(&p.server),
                esc(&p.tool),
                esc(&p.tier),
                effect,
                esc(&p.description),
                format!(
                    "<div class=\"actions\"><a class=\"button secondary\" href=\"/console/policies?edit={}\">Edit</a>{}</div>",
                    url(&p.id),
                    action(
                        "DELETE",
                        &format!("/admin/policies/{}", url(&p.id)),
                        "Delete",
                        "danger",
                    )
                ),
            ]
        })
        .collect();
    let body = format!(
        "{}<p class=\"hint\">Deny beats require_approval beats allow; a new or edited rule applies to the next call.</p>\
         <p class=\"status\" role=\"status\"></p>{}",
        policy_form(editing),
        table(
            &[
                "id",
                "principal",
                "server",
                "tool",
                "tier",
                "effect",
                "description",
                ""
            ],
            &rows,
            "policies"
        )
    );
    Html(page("Policies", "policies", &body)).into_response()
}

const APPROVAL_COLUMNS: [&str; 6] = ["requested", "who asked", "tool", "arguments", "expires", ""];

/// Pending rows, each principal shown with its token's name.
async fn pending_rows(state: &ConsoleState) -> Result<String, ops::AdminError> {
    let store = state.gateway.governance().store();
    let pending = ops::pending_approvals(store).await?;
    let names: std::collections::HashMap<String, String> = ops::list_tokens(store)
        .await?
        .into_iter()
        .map(|t| (format!("token:{}", t.id), t.name))
        .collect();
    Ok(approval_rows_html(&pending, &names))
}

fn approval_rows_html(
    approvals: &[ops::ApprovalInfo],
    names: &std::collections::HashMap<String, String>,
) -> String {
    let rows: Vec<Vec<String>> = approvals
        .iter()
        .map(|a| {
            let who = match names.get(&a.principal) {
                Some(name) => format!(
                    "{}<div class=\"hint\">{}</div>",
                    esc(name),
                    esc(&a.principal)
                ),
                None => esc(&a.principal),
            };
            vec![
                format!(
                    "{}<div class=\"hint\"><code>{}</code></div>",
                    esc(&ops::format_ms(a.created_at)),
                    esc(&a.id)
                ),
                who,
                format!("<code>{}</code>", esc(&a.tool)),
                json_block(&a.redacted_args),
                esc(&ops::format_ms(a.expires_at)),
                format!(
                    "<div class=\"actions\" data-approval=\"{}\">{}{}</div>",
                    esc(&a.id),
                    action(
                        "POST",
                        &format!("/admin/approvals/{}/approve", url(&a.id)),
                        "Approve",
                        "",
                    ),
                    action(
                        "POST",
                        &format!("/admin/approvals/{}/deny", url(&a.id)),
                        "Deny",
                        "danger",
                    )
                ),
            ]
        })
        .collect();
    rows_html(&rows, APPROVAL_COLUMNS.len())
}

async fn approvals(State(state): State<ConsoleState>) -> Response {
    let rows = match pending_rows(&state).await {
        Ok(rows) => rows,
        Err(e) => return failed(e),
    };
    let headers: String = APPROVAL_COLUMNS
        .iter()
        .map(|h| format!("<th>{}</th>", esc(h)))
        .collect();
    let body = format!(
        "<p class=\"hint\">Calls waiting for an operator; approving releases the waiting call \
         at once. Updates: <b id=\"live\">connecting…</b></p>\
         <p class=\"status\" role=\"status\"></p>\
         <div class=\"scroll\"><table id=\"approvals\"><thead><tr>{headers}</tr></thead>\
         <tbody data-live=\"/admin/approvals/events\" data-rows=\"/console/approvals/rows\">{rows}</tbody></table></div>"
    );
    Html(page("Approvals", "approvals", &body)).into_response()
}

/// The pending rows alone, which the script swaps in on each stream event.
async fn approval_rows(State(state): State<ConsoleState>) -> Response {
    match pending_rows(&state).await {
        Ok(rows) => Html(rows).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

#[derive(Deserialize)]
struct AuditForm {
    kind: Option<String>,
    n: Option<usize>,
}

/// The columns of a row worth a glance; the rest is one click away.
fn audit_summary(row: &Value) -> (String, String, String) {
    let s = |key: &str| row[key].as_str().unwrap_or("").to_string();
    let who = s("principal");
    let what = match row["kind"].as_str() {
        Some("activity") => s("tool"),
        Some("discovery") => format!("{} tools", row["visible_count"].as_i64().unwrap_or(0)),
        _ => s("reason"),
    };
    let outcome = match row["kind"].as_str() {
        Some("activity") => format!("{} · {}", s("decision"), s("outcome")),
        Some("access") => s("outcome"),
        _ => row["details"]["kind"].as_str().unwrap_or("").to_string(),
    };
    (who, what, outcome)
}

async fn audit(State(state): State<ConsoleState>, Query(f): Query<AuditForm>) -> Response {
    let kind = f.kind.clone().unwrap_or_default();
    let n = f.n.unwrap_or(50).clamp(1, 1000);
    let rows = match ops::audit_kinds(Some(&kind)) {
        Ok(kinds) => ops::audit_tail(state.gateway.governance().store(), &kinds, n).await,
        Err(e) => Err(e),
    };
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) => return failed(e),
    };
    let cells: Vec<Vec<String>> = rows
        .iter()
        .rev()
        .map(|row| {
            let (who, what, outcome) = audit_summary(row);
            vec![
                esc(&ops::format_ms(row["created_at"].as_i64().unwrap_or(0))),
                badge(row["kind"].as_str().unwrap_or("")),
                esc(&who),
                format!("<code>{}</code>", esc(&what)),
                esc(&outcome),
                format!(
                    "<details><summary>row</summary>{}</details>",
                    json_block(row)
                ),
            ]
        })
        .collect();
    let mut kinds = String::new();
    for k in ["", "activity", "access", "discovery"] {
        let selected = if k == kind { " selected" } else { "" };
        let label = if k.is_empty() { "all" } else { k };
        let _ = write!(kinds, "<option value=\"{k}\"{selected}>{label}</option>");
    }
    let body = format!(
        "<form method=\"get\" class=\"filters\"><label>trail <select name=\"kind\">{kinds}</select></label>\
         <label>rows <input name=\"n\" type=\"number\" min=\"1\" max=\"1000\" value=\"{n}\"></label>\
         <button>Show</button><a class=\"button secondary\" href=\"/admin/audit/export?kind={}\">Export JSON lines</a></form>\
         <p class=\"hint\">Newest first. Arguments are kept only as a hash unless configured.</p>{}",
        url(&kind),
        table(
            &["time", "trail", "who", "what", "outcome", ""],
            &cells,
            "audit"
        )
    );
    Html(page("Audit", "audit", &body)).into_response()
}

/// Starts a sign-in of the gateway to an `auth = "oauth"` server and sends
/// the browser to its authorization server; it comes back to
/// `/oauth/callback`.
async fn sign_in(
    State(state): State<ConsoleState>,
    Path(name): Path<String>,
    headers: axum::http::HeaderMap,
) -> Response {
    let base = crate::http::auth::public_base(&state.auth.auth, &headers);
    match ops::begin_sign_in(&state.gateway, &name, &base).await {
        Ok(to) => axum::response::Redirect::to(&to).into_response(),
        Err(error) => (StatusCode::BAD_REQUEST, error.to_string()).into_response(),
    }
}
