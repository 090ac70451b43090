//! The catalog's pages: every tool, one tool, and two search strategies
//! side by side.

use std::fmt::Write;

use axum::{
    extract::{Path, Query, State},
    response::{Html, IntoResponse, Response},
};
use serde::Deserialize;

use super::{
    html::{action, action_with, badge, esc, json_block, page, strategy_select, table, url},
    state::{ConsoleState, failed},
};
use crate::admin::{ops, parse_strategies};

#[derive(Deserialize)]
pub(super) struct CatalogQuery {
    server: Option<String>,
    q: Option<String>,
}

pub(super) async fn catalog(
    State(state): State<ConsoleState>,
    Query(q): Query<CatalogQuery>,
) -> Response {
    let server = q.server.as_deref().filter(|s| !s.is_empty());
    let tools = match ops::tools(&state.gateway, server, q.q.as_deref()).await {
        Ok(tools) => tools,
        Err(e) => return failed(e),
    };
    let servers = ops::servers(&state.gateway).await;
    let mut options = String::from("<option value=\"\">all servers</option>");
    for s in servers.iter().filter(|s| s.enabled) {
        let selected = if Some(s.name.as_str()) == server {
            " selected"
        } else {
            ""
        };
        let _ = write!(
            options,
            "<option value=\"{0}\"{selected}>{0}</option>",
            esc(&s.name)
        );
    }
    let rows: Vec<Vec<String>> = tools
        .iter()
        .map(|t| {
            vec![
                format!(
                    "<a href=\"/console/tools/{}/{}\">{}</a><div class=\"hint\">{}</div>",
                    url(&t.server),
                    url(&t.tool),
                    esc(&t.name),
                    esc(&t.description)
                ),
                badge(&t.tier),
                badge(&t.status),
                t.tokens.to_string(),
                format!("<code>{}</code>", esc(t.hash.get(..12).unwrap_or(&t.hash))),
            ]
        })
        .collect();
    let body = format!(
        "<form method=\"get\" class=\"filters\"><label>server <select name=\"server\">{options}</select></label>\
         <label>filter <input name=\"q\" value=\"{}\" placeholder=\"name or description\"></label>\
         <button>Show</button></form><p class=\"hint\" id=\"tool-count\">{} tools</p>{}",
        esc(q.q.as_deref().unwrap_or("")),
        tools.len(),
        table(
            &["tool", "tier", "status", "tokens", "hash"],
            &rows,
            "tools"
        )
    );
    Html(page("Catalog", "catalog", &body)).into_response()
}

pub(super) async fn tool_page(
    State(state): State<ConsoleState>,
    Path((server, name)): Path<(String, String)>,
) -> Response {
    let t = match ops::tool(&state.gateway, &server, &name).await {
        Ok(t) => t,
        Err(e) => return failed(e),
    };
    let s = &t.summary;
    let base = format!("/admin/tools/{}/{}", url(&s.server), url(&s.tool));
    let quarantine = if s.status == "quarantined" {
        // The hash this page shows goes with the button: a definition that
        // changes after the page was drawn is refused, not approved.
        action_with(
            "POST",
            &format!("{base}/approve"),
            "Approve definition",
            "",
            &[("hash", &s.hash)],
        )
    } else {
        action(
            "POST",
            &format!("{base}/quarantine"),
            "Quarantine",
            "danger",
        )
    };
    let mut tiers = String::new();
    for tier in ["read_only", "write", "destructive", "none"] {
        let _ = write!(tiers, "<option value=\"{tier}\">{tier}</option>");
    }
    let classify = format!(
        "<form class=\"inline\" data-api=\"POST {base}/classify\"><label>tier \
         <select name=\"tier\">{tiers}</select></label><button class=\"secondary\">Classify</button></form>"
    );
    let reason = s
        .quarantine_reason
        .as_deref()
        .map(|r| format!(" ({})", esc(r)))
        .unwrap_or_default();
    let annotations = t
        .annotations
        .as_ref()
        .map_or_else(|| "<p class=\"hint\">none</p>".to_string(), json_block);
    let output = t
        .output_schema
        .as_ref()
        .map(|o| format!("<h2>Output schema</h2>{}", json_block(o)))
        .unwrap_or_default();
    let body = format!(
        "<p>{}</p><dl class=\"facts\">\
         <dt>server</dt><dd><a href=\"/console/catalog?server={}\">{}</a></dd>\
         <dt>tier</dt><dd id=\"tool-tier\">{} <span class=\"hint\">from {}</span></dd>\
         <dt>status</dt><dd id=\"tool-status\">{}{reason}</dd>\
         <dt>hash</dt><dd><code class=\"wrap\">{}</code></dd>\
         <dt>approved hash</dt><dd><code class=\"wrap\">{}</code></dd>\
         <dt>definition tokens</dt><dd>{}</dd></dl>\
         <div class=\"actions\">{quarantine}{classify}</div><p class=\"status\" role=\"status\"></p>\
         <h2>Input schema</h2>{}{output}\
         <h2>Annotations <span class=\"hint\">(hints from the upstream, not trusted)</span></h2>{annotations}\
         <h2>TypeScript stub</h2><pre id=\"stub\">{}</pre>",
        esc(&t.description),
        url(&s.server),
        esc(&s.server),
        badge(&s.tier),
        esc(&s.tier_source),
        badge(&s.status),
        esc(&s.hash),
        esc(t.approved_hash.as_deref().unwrap_or("-")),
        s.tokens,
        json_block(&t.input_schema),
        esc(&t.typescript),
    );
    Html(page(&s.name, "catalog", &body)).into_response()
}

#[derive(Deserialize)]
pub(super) struct SearchForm {
    q: Option<String>,
    a: Option<String>,
    b: Option<String>,
    limit: Option<usize>,
}

pub(super) async fn search(
    State(state): State<ConsoleState>,
    Query(f): Query<SearchForm>,
) -> Response {
    let a = f.a.as_deref().unwrap_or("bm25").to_string();
    let b = f.b.as_deref().unwrap_or("regex").to_string();
    let query = f.q.clone().unwrap_or_default();
    let mut body = format!(
        "<form method=\"get\" class=\"filters\"><label class=\"grow\">query \
         <input name=\"q\" value=\"{}\" placeholder=\"create a github issue\" required></label>\
         <label>left {}</label><label>right {}</label><button>Compare</button></form>",
        esc(&query),
        strategy_select("a", &a),
        strategy_select("b", &b)
    );
    if !query.trim().is_empty() {
        let result = match parse_strategies(Some(&format!("{a},{b}"))) {
            Ok(strategies) => {
                ops::compare_search(&state.gateway, &query, &strategies, f.limit.unwrap_or(8)).await
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(comparison) => {
                body.push_str("<div class=\"columns\">");
                for (i, r) in comparison.results.iter().enumerate() {
                    let ran = r.strategy.as_deref().unwrap_or("-");
                    let note = if ran != r.requested && r.strategy.is_some() {
                        format!(" <span class=\"hint\">(ran as {})</span>", esc(ran))
                    } else {
                        String::new()
                    };
                    let _ = write!(
                        body,
                        "<section class=\"card result\" data-strategy=\"{}\" id=\"result-{i}\">\
                         <h2>{}{note}</h2><p class=\"hint\">{} hits in {:.1} ms</p>",
                        esc(&r.requested),
                        esc(&r.requested),
                        r.hits.len(),
                        r.took_ms
                    );
                    if let Some(error) = &r.error {
                        let _ = write!(body, "<p class=\"error\">{}</p>", esc(error));
                    }
                    body.push_str("<ol>");
                    for hit in &r.hits {
                        let (server, tool) = hit
                            .name
                            .split_once("__")
                            .unwrap_or((hit.server.as_str(), hit.name.as_str()));
                        let _ = write!(
                            body,
                            "<li><a href=\"/console/tools/{}/{}\">{}</a><div class=\"hint\">{}</div></li>",
                            url(server),
                            url(tool),
                            esc(&hit.name),
                            esc(&hit.description)
                        );
                    }
                    body.push_str("</ol></section>");
                }
                body.push_str("</div>");
            }
            Err(e) => {
                let _ = write!(
                    body,
                    "<p class=\"error\" role=\"alert\">{}</p>",
                    esc(&e.to_string())
                );
            }
        }
    }
    Html(page("Compare search strategies", "search", &body)).into_response()
}
