//! The meta-tools of progressive mode. Their names, descriptions and schemas
//! are constants: the `tools` array never changes, so prompt caches hold.
// Meta-tools return their tool errors as `Err(CallToolResult)` values, which
// are answered once per call; boxing them buys nothing.
#![allow(clippy::result_large_err)]

use std::sync::Arc;

use manifold_broker::{BrokerError, Caller, RequestKind, Subject};
use manifold_search::Strategy;
use manifold_store::Action;
use manifold_upstream::CallContext;
use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock as Content, JsonObject, Tool, ToolAnnotations,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    call::{as_tool_error, call_in_view, error_result, unknown_tool_message},
    code,
    discovery::{self, Detail, tool_details},
};
use crate::{GatewayState, provider::export};

pub const SEARCH_TOOLS: &str = "search_tools";
pub const GET_TOOL_DETAILS: &str = "get_tool_details";
pub const CALL_TOOL: &str = "call_tool";
pub const SEARCH_AVAILABLE_SERVERS: &str = "search_available_servers";
pub const ENABLE_SERVER: &str = "enable_server";
pub const DISABLE_SERVER: &str = "disable_server";
pub const EXECUTE_CODE: &str = "execute_code";

fn schema(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => unreachable!("meta-tool schemas are objects"),
    }
}

fn tool(name: &'static str, description: &'static str, input: Value, read_only: bool) -> Tool {
    let mut annotations = ToolAnnotations::default();
    annotations.read_only_hint = Some(read_only);
    let mut tool = Tool::new(name, description, schema(input));
    tool.annotations = Some(annotations);
    tool
}

/// The fixed meta-tool array, in a fixed order, without code mode.
pub fn meta_tools() -> Vec<Tool> {
    meta_tools_for(false)
}

/// The fixed meta-tool array; `code_mode` adds `execute_code` at the end.
pub fn meta_tools_for(code_mode: bool) -> Vec<Tool> {
    let mut tools = base_meta_tools();
    if code_mode {
        tools.push(tool(
            EXECUTE_CODE,
            "Run TypeScript in a sandbox for tasks with many tool calls or large intermediate \
             results. Call tools as `await server.tool(input)` (typed stubs: search_tools with detail \
             \"typescript\"); a failed call throws ToolError. Console output and the returned value \
             come back; no network, files or timers.",
            json!({
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
                "additionalProperties": false
            }),
            false,
        ));
    }
    tools
}

// What each option does and when to use it is in docs/meta-tools.md, not
// here: these texts ride in every prompt, so they say what to do and leave
// the rarely used values (strategy, format) valid but undescribed.
fn base_meta_tools() -> Vec<Tool> {
    vec![
        tool(
            SEARCH_TOOLS,
            "Find tools on the connected MCP servers for a task, described in words. Results come \
             grouped by server; run one with call_tool (get_tool_details gives its schema).",
            json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                    "server": {"type": "string"},
                    "detail": {"type": "string", "enum": ["name", "summary", "full", "typescript"]},
                    "strategy": {"type": "string"},
                    "format": {"type": "string"}
                },
                "required": ["query"],
                "additionalProperties": false
            }),
            true,
        ),
        tool(
            GET_TOOL_DETAILS,
            "Full definitions of tools by qualified name: name for one, names for several.",
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "names": {"type": "array", "items": {"type": "string"}, "maxItems": 20},
                    "format": {"type": "string", "enum": ["json", "typescript"]}
                },
                "additionalProperties": false
            }),
            true,
        ),
        tool(
            CALL_TOOL,
            "Run a tool by qualified name with arguments that match its input schema.",
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "arguments": {"type": "object"}
                },
                "required": ["name"],
                "additionalProperties": false
            }),
            false,
        ),
        tool(
            SEARCH_AVAILABLE_SERVERS,
            "Find configured servers, connected or not, by what they do.",
            json!({
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "additionalProperties": false
            }),
            true,
        ),
        tool(
            ENABLE_SERVER,
            "Add a configured server's tools to your search.",
            json!({
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
                "additionalProperties": false
            }),
            false,
        ),
        tool(
            DISABLE_SERVER,
            "Remove a server's tools from your search when a task is done.",
            json!({
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
                "additionalProperties": false
            }),
            false,
        ),
    ]
}

/// The read-only meta-tools that admission control counts as discovery.
pub fn is_discovery_tool(name: &str) -> bool {
    matches!(
        name,
        SEARCH_TOOLS | GET_TOOL_DETAILS | SEARCH_AVAILABLE_SERVERS
    )
}

pub fn is_meta_tool(name: &str) -> bool {
    matches!(
        name,
        SEARCH_TOOLS
            | GET_TOOL_DETAILS
            | CALL_TOOL
            | SEARCH_AVAILABLE_SERVERS
            | ENABLE_SERVER
            | DISABLE_SERVER
            | EXECUTE_CODE
    )
}

fn json_result(value: Value) -> CallToolResult {
    // Text only: a structuredContent copy would double what reaches the model.
    let text = serde_json::to_string(&value).expect("json values serialize");
    CallToolResult::success(vec![Content::text(text)])
}

/// A governance refusal as a structured tool error.
fn refused(refusal: manifold_broker::Refusal) -> CallToolResult {
    CallToolResult::structured_error(refusal.to_json())
}

fn parse<T: for<'de> Deserialize<'de>>(tool: &str, args: JsonObject) -> Result<T, CallToolResult> {
    serde_json::from_value(Value::Object(args))
        .map_err(|e| error_result(format!("invalid arguments for {tool}: {e}")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    query: String,
    limit: Option<usize>,
    server: Option<String>,
    #[serde(default)]
    detail: Detail,
    strategy: Option<Strategy>,
    format: Option<export::SearchFormat>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DetailsArgs {
    name: Option<String>,
    names: Option<Vec<String>>,
    format: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CallArgs {
    name: String,
    arguments: Option<JsonObject>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CodeArgs {
    code: String,
}

async fn execute_code(
    state: &GatewayState,
    caller: &Caller,
    args: JsonObject,
) -> Result<CallToolResult, CallToolResult> {
    let args: CodeArgs = parse(EXECUTE_CODE, args)?;
    let Some(code_mode) = state.code_mode() else {
        return Err(error_result("code mode is disabled on this gateway"));
    };
    let started = std::time::Instant::now();
    let execution = code_mode.execute(caller, &args.code).await;
    code::record_run(&execution, started.elapsed());
    Ok(code::render(&execution, code_mode.limits()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServersArgs {
    #[serde(default)]
    query: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerNameArgs {
    name: String,
}

/// Run one meta-tool.
pub async fn call_meta(
    state: &GatewayState,
    caller: &Caller,
    name: &str,
    args: JsonObject,
    context: CallContext,
) -> CallToolResponse {
    let result = match name {
        SEARCH_TOOLS => search_tools(state, caller, args).await,
        GET_TOOL_DETAILS => get_tool_details(state, caller, args).await,
        CALL_TOOL => return call_tool(state, caller, args, context).await,
        SEARCH_AVAILABLE_SERVERS => search_available_servers(state, caller, args).await,
        ENABLE_SERVER => enable_server(state, caller, args).await,
        DISABLE_SERVER => disable_server(state, caller, args).await,
        EXECUTE_CODE => execute_code(state, caller, args).await,
        other => Err(error_result(format!("unknown meta-tool {other}"))),
    };
    CallToolResponse::Complete(result.unwrap_or_else(|e| e))
}

async fn search_tools(
    state: &GatewayState,
    caller: &Caller,
    args: JsonObject,
) -> Result<CallToolResult, CallToolResult> {
    let args: SearchArgs = parse(SEARCH_TOOLS, args)?;
    if let Some(format) = args.format {
        let request = export::ProviderSearch {
            query: args.query,
            limit: args.limit,
            server: args.server,
            strategy: args.strategy,
            format,
            call_id: None,
        };
        return match export::search(state, caller, &request).await {
            Ok(result) => Ok(json_result(result)),
            Err(export::ExportError::Refused(refusal)) => Err(refused(refusal)),
            Err(e) => Err(error_result(e.to_string())),
        };
    }
    let limit = args
        .limit
        .unwrap_or(state.config.default_limit)
        .clamp(1, state.config.max_limit);
    let visible = state.visible(caller, None).await.map_err(refused)?;
    let strategy = args.strategy.unwrap_or(state.config.strategy);
    let search = || {
        state.discovery.search(
            &visible,
            &args.query,
            strategy,
            limit,
            args.server.as_deref(),
            args.detail,
        )
    };
    // Embedding a query (or a changed catalog) blocks: keep it off the
    // runtime's other tasks where the runtime allows it.
    let blocking = state.discovery.may_block()
        && tokio::runtime::Handle::current().runtime_flavor()
            == tokio::runtime::RuntimeFlavor::MultiThread;
    let outcome = if blocking {
        tokio::task::block_in_place(search)
    } else {
        search()
    }
    .map_err(|e| error_result(e.to_string()))?;
    let mut outcome = outcome;
    if outcome.typescript.is_some()
        && let Some(code_mode) = state.code_mode()
    {
        // Named exactly as the sandbox will bind them.
        let full = state.catalog.view(&caller.principal).await;
        let names = outcome.names();
        let tools: Vec<&manifold_catalog::CatalogTool> = names
            .iter()
            .filter_map(|n| visible.view.tool(n).map(|t| t.as_ref()))
            .collect();
        let typescript = discovery::typescript(&tools, &code_mode.bindings(&full));
        outcome.typescript = Some(typescript);
    }
    state
        .governance()
        .record_search(caller, &outcome.names())
        .await;
    Ok(json_result(
        serde_json::to_value(outcome).expect("serializes"),
    ))
}

/// How many names one `get_tool_details` call may ask for, and how long each
/// may be: every name is a lookup and, when unknown, a fuzzy search.
pub(crate) const MAX_DETAIL_NAMES: usize = 20;
pub(crate) const MAX_TOOL_NAME_BYTES: usize = 512;
async fn get_tool_details(
    state: &GatewayState,
    caller: &Caller,
    args: JsonObject,
) -> Result<CallToolResult, CallToolResult> {
    let args: DetailsArgs = parse(GET_TOOL_DETAILS, args)?;
    let names: Vec<String> = match (args.name, args.names) {
        (Some(n), None) => vec![n],
        (None, Some(ns)) if !ns.is_empty() => ns,
        _ => return Err(error_result("give either name or a non-empty names array")),
    };
    if names.len() > MAX_DETAIL_NAMES {
        return Err(error_result(format!(
            "too many names: {} in one call, at most {MAX_DETAIL_NAMES}; ask in several calls",
            names.len()
        )));
    }
    if let Some(long) = names.iter().find(|n| n.len() > MAX_TOOL_NAME_BYTES) {
        return Err(error_result(format!(
            "a name of {} bytes is longer than any tool name (at most {MAX_TOOL_NAME_BYTES})",
            long.len()
        )));
    }
    let visible = state
        .visible(caller, Some("details"))
        .await
        .map_err(refused)?;
    let mut found = Vec::new();
    let mut found_tools = Vec::new();
    let mut unknown = Vec::new();
    for name in &names {
        match visible.view.tool(name) {
            Some(tool) => {
                found_tools.push(tool.as_ref());
                found.push(tool_details(
                    tool,
                    visible.needs_approval.contains(&tool.qualified),
                ))
            }
            None => {
                let suggestions = state.discovery.suggest(&visible.view, name);
                unknown.push(unknown_tool_message(name, &suggestions));
            }
        }
    }
    if found.is_empty() {
        return Err(error_result(unknown.join("\n")));
    }
    let mut out = match args.format.as_deref() {
        None | Some("json") => json!({ "tools": found }),
        Some("typescript") => {
            let full = state.catalog.view(&caller.principal).await;
            let bindings = match state.code_mode() {
                Some(code_mode) => code_mode.bindings(&full),
                None => Arc::new(discovery::script_bindings(&full)),
            };
            json!({
                "tools": found_tools.iter().map(|t| t.qualified.as_str()).collect::<Vec<_>>(),
                "typescript": discovery::typescript(&found_tools, &bindings),
            })
        }
        Some(other) => {
            return Err(error_result(format!(
                "unknown format '{other}' (expected json or typescript)"
            )));
        }
    };
    if !unknown.is_empty() {
        out["unknown"] = json!(unknown);
    }
    Ok(json_result(out))
}

/// Forward a call through the broker; the upstream's result, `isError` included,
/// passes through unchanged.
pub(crate) async fn call_tool(
    state: &GatewayState,
    caller: &Caller,
    args: JsonObject,
    context: CallContext,
) -> CallToolResponse {
    let args: CallArgs = match parse(CALL_TOOL, args) {
        Ok(a) => a,
        Err(e) => return CallToolResponse::Complete(e),
    };
    // A provider-facing name (from `manifold export`) maps back to the
    // qualified name; the broker still authorizes the call.
    let view = state
        .catalog
        .view_for_call(&caller.principal, &args.name)
        .await;
    let name = export::resolve(&view, &args.name, None).unwrap_or(args.name);
    call_in_view(state, view, caller, &name, args.arguments, context)
        .await
        .unwrap_or_else(|error| as_tool_error(&name, error))
}

async fn search_available_servers(
    state: &GatewayState,
    caller: &Caller,
    args: JsonObject,
) -> Result<CallToolResult, CallToolResult> {
    let args: ServersArgs = parse(SEARCH_AVAILABLE_SERVERS, args)?;
    let visible = state.visible(caller, None).await.map_err(refused)?;
    let view = &visible.view;
    // Only servers the caller could switch into its view are shown.
    let rules = state
        .governance()
        .rules(caller, Action::Discover)
        .await
        .map_err(refused)?;
    let terms: Vec<String> = args
        .query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|t| t.len() > 1)
        .map(str::to_lowercase)
        .collect();
    let mut scored: Vec<(usize, Value)> = state
        .catalog
        .statuses()
        .into_iter()
        .filter(|(status, _)| rules.shows(&Subject::server(&status.name)))
        .filter_map(|(status, _)| {
            let enabled = state
                .catalog
                .is_enabled_for(&status.name, &caller.principal);
            let haystack = format!("{} {}", status.name, status.description).to_lowercase();
            let score = terms
                .iter()
                .filter(|t| haystack.contains(t.as_str()))
                .count();
            if !terms.is_empty() && score == 0 {
                return None;
            }
            let state_name = match (&status.state, enabled) {
                (manifold_upstream::UpstreamState::Connected, _) => "connected",
                (manifold_upstream::UpstreamState::Failed(_), _) => "failed",
                (_, _) => "not_connected",
            };
            let listed = view.server(&status.name);
            let mut entry = json!({
                "name": status.name,
                "description": status.description,
                "state": state_name,
                "enabled": enabled,
                "tools": listed.map_or(0, |s| s.tools.len()),
                "restarts": status.restarts,
            });
            if let Some(error) = listed.and_then(|s| s.error.as_deref()) {
                entry["listing_error"] = json!(error);
            }
            if let manifold_upstream::UpstreamState::Failed(reason) = &status.state {
                entry["error"] = json!(reason);
            }
            if let Some(how) = &status.sign_in {
                entry["state"] = json!("needs_sign_in");
                entry["sign_in"] = json!(how);
            }
            // A per-principal server: whether this caller has signed in.
            if status.principal_connections.is_some()
                && let Some(error) = listed.and_then(|s| s.error.as_deref())
                && error.starts_with("auth_required")
            {
                entry["state"] = json!("needs_sign_in");
                entry["sign_in"] = json!(error);
            }
            if let Some(last) = &status.last_error {
                entry["last_error"] = json!(last);
            }
            Some((score, entry))
        })
        .collect();
    scored.sort_by_key(|(score, _)| std::cmp::Reverse(*score));
    let servers: Vec<Value> = scored.into_iter().map(|(_, v)| v).collect();
    Ok(json_result(json!({ "servers": servers })))
}

/// A broker refusal of a server switch as the tool error the model reads.
fn switch_refused(error: BrokerError) -> CallToolResult {
    match error {
        BrokerError::Refused(refusal) => refused(refusal),
        BrokerError::Unknown { name, .. } => error_result(format!(
            "unknown server '{name}'; search_available_servers lists them"
        )),
        other => error_result(other.to_string()),
    }
}

/// Puts a server in the caller's own view, connecting it if needed, once
/// the broker has authorised the caller for it. Nobody else's view changes;
/// switching a server for everyone is an operator's action (admin API).
async fn enable_server(
    state: &GatewayState,
    caller: &Caller,
    args: JsonObject,
) -> Result<CallToolResult, CallToolResult> {
    let args: ServerNameArgs = parse(ENABLE_SERVER, args)?;
    let allowed = state
        .broker
        .allow_server_switch(caller, RequestKind::EnableServer, &args.name)
        .await
        .map_err(switch_refused)?;
    let count = state
        .broker
        .enable_server(&allowed, &caller.principal)
        .await
        .map_err(|e| error_result(e.to_string()))?;
    let visible = state.visible(caller, None).await.map_err(refused)?;
    let count = visible
        .view
        .server(&args.name)
        .map_or(0, |s| s.tools.len())
        .min(count);
    let sample: Vec<&str> = visible
        .view
        .server(&args.name)
        .map(|s| {
            s.tools
                .iter()
                .take(8)
                .map(|t| t.qualified.as_str())
                .collect()
        })
        .unwrap_or_default();
    Ok(json_result(json!({
        "server": args.name,
        "state": "connected",
        "tools": count,
        "summary": format!("{} tools indexed; search_tools finds them. For example: {}", count, sample.join(", ")),
    })))
}

/// Takes a server out of the caller's own view. The connection stays for
/// everyone else.
async fn disable_server(
    state: &GatewayState,
    caller: &Caller,
    args: JsonObject,
) -> Result<CallToolResult, CallToolResult> {
    let args: ServerNameArgs = parse(DISABLE_SERVER, args)?;
    let allowed = state
        .broker
        .allow_server_switch(caller, RequestKind::DisableServer, &args.name)
        .await
        .map_err(switch_refused)?;
    if !state.broker.disable_server(&allowed, &caller.principal) {
        return Err(error_result(format!("unknown server '{}'", args.name)));
    }
    Ok(json_result(
        json!({ "server": args.name, "state": "disabled_for_caller" }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(tools: &[Tool]) -> usize {
        tools
            .iter()
            .map(|t| manifold_catalog::count_tokens(&serde_json::to_string(t).expect("serializes")))
            .sum()
    }

    /// Every prompt carries the menu: with code mode it costs at most 600
    /// o200k tokens (`manifold catalog stats` reports the same sum).
    #[test]
    fn the_menu_costs_at_most_600_tokens() {
        let with_code = tokens(&meta_tools_for(true));
        assert!(with_code <= 600, "{with_code} tokens");
        assert!(tokens(&meta_tools()) < with_code);
    }

    /// Options the descriptions leave out (docs/meta-tools.md has them)
    /// are still in the schemas, so strict clients may send them.
    #[test]
    fn rare_options_stay_in_the_schemas() {
        let tools = meta_tools_for(true);
        let props = |name: &str| {
            let t = tools.iter().find(|t| t.name == name).expect("listed");
            t.input_schema["properties"]
                .as_object()
                .expect("properties")
                .keys()
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(
            props(SEARCH_TOOLS),
            ["query", "limit", "server", "detail", "strategy", "format"]
        );
        assert_eq!(props(GET_TOOL_DETAILS), ["name", "names", "format"]);
    }
}
