//! The playground: search with one strategy, open a tool (details and its
//! TypeScript stub), call it through a form built from its input schema, and
//! see the result with the activity row the call left.
//!
//! The call is the signed-in operator's own, through the broker
//! ([`ops::playground_call`]): the operator's token needs the `call` action,
//! and policy, quarantine, rate limits, approvals and validation apply as to
//! any caller. The form is posted by the console's script with its header;
//! the answer is this section drawn again, errors next to their fields.

use std::fmt::Write;

use axum::{
    Extension,
    body::Bytes,
    extract::{Query, State},
    http::StatusCode,
    response::{Html, IntoResponse, Response},
};
use manifold_broker::{BrokerError, Caller};
use rmcp::model::CallToolResponse;
use serde::Deserialize;
use serde_json::Value;

use super::{
    html::{badge, esc, json_block, page, strategy_select, url},
    schema_form::{self, Errors, PREFIX, Values},
    state::{ConsoleState, failed},
};
use crate::admin::ops::{self, PlaygroundCall, ToolDetail};

#[derive(Deserialize)]
pub(super) struct PlaygroundQuery {
    q: Option<String>,
    strategy: Option<String>,
    /// The qualified name of the tool to open.
    tool: Option<String>,
}

pub(super) async fn show(
    State(state): State<ConsoleState>,
    Query(q): Query<PlaygroundQuery>,
) -> Response {
    let query = q.q.clone().unwrap_or_default();
    let strategy = q
        .strategy
        .clone()
        .unwrap_or_else(|| state.gateway.config.strategy.to_string());
    let mut body = format!(
        "<form method=\"get\" class=\"filters\" id=\"playground-search\"><label class=\"grow\">query \
         <input name=\"q\" value=\"{}\" placeholder=\"read a file\" required></label>\
         <label>strategy {}</label><button>Search</button></form>",
        esc(&query),
        strategy_select("strategy", &strategy),
    );
    if !query.trim().is_empty() {
        body.push_str(&hits(&state, &query, &strategy).await);
    }
    if let Some(tool) = q.tool.as_deref().filter(|t| !t.is_empty()) {
        match ops::tool_named(&state.gateway, tool).await {
            Ok(detail) => {
                body.push_str(&details(&detail));
                body.push_str(&call_section(&detail, &Values::new(), &Errors::new(), None));
            }
            Err(e) => return failed(e),
        }
    }
    Html(page("Playground", "playground", &body)).into_response()
}

async fn hits(state: &ConsoleState, query: &str, strategy: &str) -> String {
    let strategies = match crate::admin::parse_strategies(Some(strategy)) {
        Ok(s) => s,
        Err(e) => {
            return format!(
                "<p class=\"error\" role=\"alert\">{}</p>",
                esc(&e.to_string())
            );
        }
    };
    let result = match ops::compare_search(&state.gateway, query, &strategies, 8).await {
        Ok(mut comparison) if !comparison.results.is_empty() => comparison.results.remove(0),
        Ok(_) => return String::new(),
        Err(e) => {
            return format!(
                "<p class=\"error\" role=\"alert\">{}</p>",
                esc(&e.to_string())
            );
        }
    };
    let ran = result.strategy.as_deref().unwrap_or("-");
    let mut out = format!(
        "<section class=\"card result\" id=\"hits\" data-strategy=\"{}\"><p class=\"hint\">{} {} in {:.1} ms, ranked by <b>{}</b></p>",
        esc(ran),
        result.hits.len(),
        if result.hits.len() == 1 {
            "hit"
        } else {
            "hits"
        },
        result.took_ms,
        esc(ran)
    );
    if let Some(error) = &result.error {
        let _ = write!(out, "<p class=\"error\">{}</p>", esc(error));
    }
    out.push_str("<ol>");
    for hit in &result.hits {
        let _ = write!(
            out,
            "<li><a href=\"/console/playground?q={}&amp;strategy={}&amp;tool={}\">{}</a><div class=\"hint\">{}</div></li>",
            url(query),
            url(strategy),
            url(&hit.name),
            esc(&hit.name),
            esc(&hit.description)
        );
    }
    out.push_str("</ol></section>");
    out
}

fn details(t: &ToolDetail) -> String {
    let s = &t.summary;
    format!(
        "<section class=\"card\" id=\"details\" data-tool=\"{}\"><h2>{}</h2><p>{}</p>\
         <p>{} {} <a href=\"/console/tools/{}/{}\">the tool's page</a></p>\
         <h3>TypeScript stub</h3><pre id=\"playground-stub\">{}</pre>\
         <details><summary>input schema</summary>{}</details></section>",
        esc(&s.name),
        esc(&s.name),
        esc(&t.description),
        badge(&s.tier),
        badge(&s.status),
        url(&s.server),
        url(&s.tool),
        esc(&t.typescript),
        json_block(&t.input_schema),
    )
}

/// The form, and after a call its result and activity row. The script puts
/// this whole section in place of the old one.
fn call_section(
    t: &ToolDetail,
    values: &Values,
    errors: &Errors,
    called: Option<&PlaygroundCall>,
) -> String {
    let fields = schema_form::fields(&t.input_schema);
    let mut out = format!(
        "<section class=\"card\" id=\"call\"><h2>Call it</h2>\
         <form class=\"grid\" id=\"call-form\" data-api=\"POST /console/playground/call\" data-swap=\"#call\">\
         <input type=\"hidden\" name=\"tool\" value=\"{}\">{}<button>Call as me</button></form>\
         <p class=\"hint\">As your own token, through the broker: policy, quarantine, rate limits, \
         approvals and validation apply, and the call is audited.</p><p class=\"status\" role=\"status\"></p>",
        esc(&t.summary.name),
        schema_form::render(&fields, values, errors),
    );
    if let Some(called) = called {
        out.push_str(&result_html(&called.outcome));
        out.push_str(&audit_html(called.audit.as_ref()));
    }
    out.push_str("</section>");
    out
}

fn result_html(outcome: &Result<CallToolResponse, BrokerError>) -> String {
    let (code, body) = match outcome {
        Ok(CallToolResponse::Complete(result)) => (
            if result.is_error == Some(true) {
                "tool_error"
            } else {
                "ok"
            },
            json_block(&serde_json::to_value(result).unwrap_or_default()),
        ),
        Ok(_) => (
            "input_required",
            "<p>The tool asked for client input, which the playground cannot relay; use an MCP client.</p>"
                .to_string(),
        ),
        Err(BrokerError::InvalidArguments { violations, .. }) => (
            "invalid_arguments",
            format!(
                "<p>Not forwarded: {} problem(s) with the arguments, shown at the fields above.</p>",
                violations.len()
            ),
        ),
        Err(BrokerError::Refused(refusal)) => (refusal.code(), json_block(&refusal.to_json())),
        Err(BrokerError::UnknownTool { name }) => (
            "unknown_tool",
            format!("<p>No tool '{}' in your view.</p>", esc(name)),
        ),
        Err(BrokerError::AuditUnavailable(error)) => (
            manifold_broker::AuditUnavailable::CODE,
            format!("<p class=\"error\">{}</p>", esc(&error.to_string())),
        ),
        Err(e) => (
            "upstream_error",
            format!("<p class=\"error\">{}</p>", esc(&e.to_string())),
        ),
    };
    format!(
        "<div id=\"call-result\" data-outcome=\"{}\"><h3>Result {}</h3>{body}</div>",
        esc(code),
        badge(code)
    )
}

fn audit_html(row: Option<&Value>) -> String {
    let Some(row) = row else {
        return "<div id=\"call-audit\"><h3>Audit</h3><p class=\"hint\">No activity row was found for this call.</p></div>"
            .to_string();
    };
    let s = |key: &str| row[key].as_str().unwrap_or("").to_string();
    let n = |key: &str| row[key].as_i64().map(|v| v.to_string()).unwrap_or_default();
    format!(
        "<div id=\"call-audit\" data-id=\"{}\" data-decision=\"{}\" data-outcome=\"{}\"><h3>Audit</h3>\
         <dl class=\"facts\"><dt>row</dt><dd><a href=\"/console/audit?kind=activity\">activity #{}</a></dd>\
         <dt>time</dt><dd>{}</dd><dt>who</dt><dd>{}</dd><dt>tool</dt><dd><code>{}</code></dd>\
         <dt>decision</dt><dd>{}</dd><dt>outcome</dt><dd>{}</dd><dt>latency</dt><dd>{} ms</dd>\
         <dt>arguments</dt><dd><code class=\"wrap\">{}</code> <span class=\"hint\">(a hash)</span></dd></dl>\
         <details><summary>row</summary>{}</details></div>",
        esc(&n("id")),
        esc(&s("decision")),
        esc(&s("outcome")),
        esc(&n("id")),
        esc(&ops::format_ms(row["created_at"].as_i64().unwrap_or(0))),
        esc(&s("principal")),
        esc(&s("tool")),
        badge(&s("decision")),
        badge(&s("outcome")),
        esc(&n("latency_ms")),
        esc(&s("args_hash")),
        json_block(row),
    )
}

/// `POST /console/playground/call`: the form's fields as the script sends
/// them (`tool`, and `arg.<property>` strings).
pub(super) async fn call(
    State(state): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> Response {
    let form: serde_json::Map<String, Value> = match serde_json::from_slice(&body) {
        Ok(form) => form,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                Html(format!(
                    "<p class=\"error\">invalid form: {}</p>",
                    esc(&e.to_string())
                )),
            )
                .into_response();
        }
    };
    let Some(tool) = form.get("tool").and_then(Value::as_str) else {
        return (
            StatusCode::BAD_REQUEST,
            Html("<p class=\"error\">the form names no tool</p>".to_string()),
        )
            .into_response();
    };
    let detail = match ops::tool_named(&state.gateway, tool).await {
        Ok(detail) => detail,
        Err(e) => return failed(e),
    };
    let values: Values = form
        .iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix(PREFIX)?;
            let text = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            Some((name.to_string(), text))
        })
        .collect();
    let fields = schema_form::fields(&detail.input_schema);
    let arguments = match schema_form::arguments(&fields, &values) {
        Ok(arguments) => arguments,
        // Nothing to send: the operator fixes the field first.
        Err(errors) => {
            return Html(call_section(&detail, &values, &errors, None)).into_response();
        }
    };
    let called = match ops::playground_call(&state.gateway, &caller, tool, arguments).await {
        Ok(called) => called,
        Err(e) => return failed(e),
    };
    let errors = match &called.outcome {
        Err(BrokerError::InvalidArguments { violations, .. }) => {
            schema_form::place(&fields, violations)
        }
        _ => Errors::new(),
    };
    Html(call_section(&detail, &values, &errors, Some(&called))).into_response()
}
