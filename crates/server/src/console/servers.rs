//! A server's page (its state, the last hour's chart, removal) and the form
//! that adds a server. Both write through the admin API
//! (`POST /admin/servers` with `persist`, `DELETE /admin/servers/{name}`),
//! which keeps the change in this replica's config file.

use axum::{
    extract::{Path, State},
    response::{Html, IntoResponse, Response},
};

use super::{
    chart,
    html::{action, badge, esc, page, url},
    state::{ConsoleState, failed},
};
use crate::admin::ops::{self, RuntimeServers};

/// The add-server form, or why there is none.
pub(super) fn add_form(runtime: &RuntimeServers) -> String {
    if !runtime.allow {
        return "<p class=\"hint\" id=\"add-server-off\">Adding and removing servers here is off \
                (<code>[admin] allow_runtime_servers = false</code>); edit the config file or use \
                <code>manifold servers add</code>.</p>"
            .to_string();
    }
    let commands = if runtime.allowed_commands.is_empty() {
        "none (HTTP servers only)".to_string()
    } else {
        runtime.allowed_commands.join(", ")
    };
    format!(
        "<form class=\"card grid\" data-api=\"POST /admin/servers\" id=\"add-server\"><h2>Add a server</h2>\
         <input type=\"hidden\" name=\"persist\" value=\"true\" data-bool>\
         <label>name <input name=\"name\" required pattern=\"[A-Za-z0-9][A-Za-z0-9_.-]*\"></label>\
         <label>description <input name=\"description\"></label>\
         <label>command <input name=\"command\" placeholder=\"stdio: a program\"></label>\
         <label>arguments <input name=\"args\" data-list placeholder=\"comma-separated\"></label>\
         <label>url <input name=\"url\" placeholder=\"or Streamable HTTP: https://…/mcp\"></label>\
         <label class=\"check\"><input type=\"checkbox\" name=\"autoconnect\" data-bool checked>connect now</label>\
         <button>Add server</button>\
         <p class=\"hint\">Written to this replica's config file (comments kept) and started at once; \
         other replicas read their own file. Commands allowed: <code>{}</code>.</p></form>",
        esc(&commands)
    )
}

pub(super) async fn show(State(state): State<ConsoleState>, Path(name): Path<String>) -> Response {
    let server = match ops::server(&state.gateway, &name).await {
        Ok(server) => server,
        Err(e) => return failed(e),
    };
    let chart = match ops::server_chart(&state.gateway, &name).await {
        Ok(chart) => chart,
        Err(e) => return failed(e),
    };
    let remove = if state.gateway.config.runtime_servers.allow {
        format!(
            "<form class=\"inline\" data-api=\"DELETE /admin/servers/{}\" data-go=\"/console\" id=\"remove-server\">\
             <button class=\"danger\">Remove from the config file</button></form>",
            url(&server.name)
        )
    } else {
        String::new()
    };
    let toggle = if server.enabled {
        action(
            "POST",
            &format!("/admin/servers/{}/disable", url(&server.name)),
            "Disable",
            "secondary",
        )
    } else {
        action(
            "POST",
            &format!("/admin/servers/{}/enable", url(&server.name)),
            "Enable",
            "",
        )
    };
    let error = server
        .error
        .as_deref()
        .map(|e| format!("<div class=\"hint\">{}</div>", esc(e)))
        .unwrap_or_default();
    let overrides = match server.overrides_not_applied.as_slice() {
        [] => String::new(),
        problems => format!(
            "<dt>tool overrides not applied</dt><dd id=\"overrides-not-applied\"><ul>{}</ul></dd>",
            problems
                .iter()
                .map(|p| format!("<li>{}</li>", esc(p)))
                .collect::<String>()
        ),
    };
    let body = format!(
        "<p>{}</p><dl class=\"facts\">\
         <dt>state</dt><dd id=\"server-state\">{}{error}</dd>\
         <dt>transport</dt><dd>{}</dd>\
         <dt>tools</dt><dd><a href=\"/console/catalog?server={}\">{}</a></dd>\
         <dt>definition tokens</dt><dd>{}</dd>\
         <dt>restarts</dt><dd>{}</dd>{overrides}</dl>\
         <div class=\"actions\">{toggle}{remove}</div><p class=\"status\" role=\"status\"></p>\
         <h2>Calls</h2>{}",
        esc(&server.description),
        badge(&server.state),
        esc(&server.transport),
        url(&server.name),
        server.tools,
        server.definition_tokens,
        server.restarts,
        chart::render(&chart),
    );
    Html(page(&server.name, "overview", &body)).into_response()
}
