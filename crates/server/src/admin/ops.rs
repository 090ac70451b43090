//! What an operator can do to a running gateway (its servers, its catalog,
//! search), as plain functions over the gateway state. The admin API and the
//! console call these, so each operation has one implementation; handlers
//! only parse input and render output. The operations on the store alone
//! (tokens, policies, approvals, audit, tool approval) are the crate
//! `manifold-operations`, re-exported here so every operation has one path.

use std::sync::Arc;

use futures::future::BoxFuture;
use manifold_broker::Visible;
use manifold_catalog::{CatalogTool, Principal};
pub use manifold_operations::*;
use manifold_search::Strategy;
use manifold_store::{ToolClassification, now_ms};
use manifold_upstream::{HttpTransport, Upstream, UpstreamConfig, UpstreamState, UpstreamStatus};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::{Detail, GatewayState, Mode};

// ---------------------------------------------------------------- overview

/// One configured server.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ServerInfo {
    pub name: String,
    pub description: String,
    /// `stdio` or `http`.
    pub transport: String,
    /// `not_connected`, `connecting`, `connected`, `failed` or
    /// `needs_sign_in` (an `oauth` server nobody has signed in to; `error`
    /// says how).
    pub state: String,
    /// Why it failed, or why its last listing did.
    pub error: Option<String>,
    /// Enabled servers are listed; `autoconnect = false` servers start disabled.
    pub enabled: bool,
    pub tools: usize,
    pub definition_tokens: usize,
    /// The listing shown is the last good one.
    pub stale: bool,
    pub restarts: u32,
    /// A `credentials = "per_principal"` server: how many callers' own
    /// connections are open. Each caller lists and calls it with its own
    /// token, so the operator's `tools` count says nothing of theirs.
    pub principal_connections: Option<usize>,
    /// The server's `[[servers.tools]]` overrides its last listing could not
    /// apply, each with the reason (a tool it does not have, a rename onto
    /// another tool's name).
    pub overrides_not_applied: Vec<String>,
}

/// What the console's first page shows.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Overview {
    /// The mode chosen at start: `direct` or `progressive`.
    pub mode: String,
    pub search_strategy: String,
    pub code_mode: bool,
    pub auth_required: bool,
    pub tools: usize,
    /// Tokens (o200k) of every listed definition.
    pub definition_tokens: usize,
    pub pending_approvals: u64,
    /// Discovery requests waiting for admission now.
    pub discovery_queue: usize,
    /// Audit rows could not be made durable at the last try: with
    /// `[governance] audit_failure = "refuse"` calls are answered
    /// `audit_unavailable` until they can.
    pub audit_unavailable: bool,
    pub servers: Vec<ServerInfo>,
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Auto => "auto",
        Mode::Direct => "direct",
        Mode::Progressive => "progressive",
    }
}

/// The admin's own picture of the catalog: every enabled server, nothing
/// filtered by policy (quarantine and tiers are shown, not applied).
async fn admin_view(state: &GatewayState) -> Arc<manifold_catalog::CatalogView> {
    state.catalog.view(&Principal("admin".into())).await
}

fn server_info(
    status: UpstreamStatus,
    enabled: bool,
    view: &manifold_catalog::CatalogView,
) -> ServerInfo {
    let listed = view.server(&status.name);
    let (state, error) = match status.state {
        UpstreamState::NotConnected => ("not_connected", None),
        UpstreamState::Connecting => ("connecting", None),
        UpstreamState::Connected => ("connected", None),
        UpstreamState::Failed(reason) => ("failed", Some(reason)),
    };
    let (state, error) = match (&status.sign_in, status.principal_connections) {
        (Some(how), _) => ("needs_sign_in", Some(how.clone())),
        (None, Some(_)) => (state, error),
        (None, None) => (
            state,
            error.or_else(|| listed.and_then(|s| s.error.clone())),
        ),
    };
    ServerInfo {
        tools: listed.map_or(0, |s| s.tools.len()),
        definition_tokens: listed.map_or(0, |s| s.tools.iter().map(|t| t.tokens()).sum()),
        stale: listed.is_some_and(|s| s.stale),
        name: status.name,
        description: status.description,
        transport: status.transport.to_string(),
        state: state.to_string(),
        error,
        enabled,
        restarts: status.restarts,
        principal_connections: status.principal_connections,
        overrides_not_applied: Vec::new(),
    }
}

pub async fn servers(state: &GatewayState) -> Vec<ServerInfo> {
    let view = admin_view(state).await;
    let mut out: Vec<ServerInfo> = state
        .catalog
        .statuses()
        .into_iter()
        .map(|(status, enabled)| {
            let overrides_not_applied = state.catalog.unmatched_overrides(&status.name);
            ServerInfo {
                overrides_not_applied,
                ..server_info(status, enabled, &view)
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

pub async fn server(state: &GatewayState, name: &str) -> Result<ServerInfo> {
    servers(state)
        .await
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| AdminError::NotFound(format!("no server '{name}'")))
}

pub async fn overview(state: &GatewayState) -> Result<Overview> {
    let servers = servers(state).await;
    Ok(Overview {
        mode: mode_name(state.config.mode).to_string(),
        search_strategy: state.config.strategy.to_string(),
        code_mode: state.code_mode().is_some(),
        auth_required: state.auth.required,
        tools: servers.iter().map(|s| s.tools).sum(),
        definition_tokens: servers.iter().map(|s| s.definition_tokens).sum(),
        pending_approvals: state.governance().store().count_pending().await?,
        discovery_queue: state.admission.queue_depth(),
        audit_unavailable: state.governance().audit_unavailable(),
        servers,
    })
}

/// Connects a server and lists its tools, or disconnects it and drops them,
/// for everyone, on every replica (callers' own switches of it are dropped).
pub async fn set_enabled(state: &GatewayState, name: &str, enabled: bool) -> Result<ServerInfo> {
    if state.catalog.upstream(name).is_none() {
        return Err(AdminError::NotFound(format!("no server '{name}'")));
    }
    if enabled {
        state
            .catalog
            .enable(name, &Principal("admin".into()))
            .await
            .map_err(|e| AdminError::Upstream(e.to_string()))?;
    } else {
        state
            .catalog
            .disable(name)
            .await
            .map_err(|e| AdminError::Upstream(e.to_string()))?;
    }
    // A switch for everyone: the other replicas follow it too.
    state
        .publish(manifold_store::StoreEvent::ServerSwitched {
            server: name.to_string(),
            enabled,
        })
        .await;
    server(state, name).await
}

/// Where a person signs the gateway in to `name` (an `auth = "oauth"`
/// server): the authorization URL, whose callback is `<base>/oauth/callback`
/// on any replica. The PKCE state and the client waiting for it are kept
/// (sealed) in the store.
pub async fn begin_sign_in(state: &GatewayState, name: &str, base: &str) -> Result<String> {
    let upstream = state
        .catalog
        .upstream(name)
        .ok_or_else(|| AdminError::NotFound(format!("no server '{name}'")))?;
    let config = upstream.config();
    if config.auth != Some(manifold_upstream::UpstreamAuth::Oauth) {
        return Err(AdminError::Invalid(format!(
            "server '{name}' does not have auth = \"oauth\""
        )));
    }
    if upstream.per_principal() {
        return Err(AdminError::Invalid(format!(
            "server '{name}' has credentials = \"per_principal\": each caller signs in for itself, from the URL its first call answers"
        )));
    }
    let redirect_uri = format!("{}/oauth/callback", base.trim_end_matches('/'));
    state
        .oauth()
        .begin_sign_in(config, "", &redirect_uri)
        .await
        .map(|(_, url)| url)
        .map_err(AdminError::Upstream)
}

/// Finishes a sign-in at its callback, then connects the server for
/// everyone (every replica finds the tokens in the store). Returns its name.
pub async fn finish_sign_in(
    state: &GatewayState,
    oauth_state: &str,
    code: &str,
    issuer: Option<&str>,
) -> Result<String> {
    let config_of = |name: &str| state.catalog.upstream(name).map(|u| u.config().clone());
    let (name, principal) = state
        .oauth()
        .finish_sign_in(config_of, oauth_state, code, issuer)
        .await
        .map_err(AdminError::Invalid)?;
    if principal.is_empty() {
        set_enabled(state, &name, true).await?;
    } else if let Some(upstream) = state.catalog.upstream(&name) {
        // One caller of a per-principal server: its next request lists
        // and calls with the new token.
        upstream.signed_in(&principal);
        state.catalog.invalidate(&name);
    }
    Ok(name)
}

/// A server to add at run time. It lives until the gateway stops, unless
/// `persist` writes it into the config file.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddServer {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// A stdio server's command; give either this or `url`.
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// An HTTP server's URL: Streamable HTTP, or legacy SSE, which the
    /// connection detects (`transport = "auto"`).
    pub url: Option<String>,
    /// How to reach `url`: `auto` (default), `streamable_http` or `sse`.
    pub transport: Option<String>,
    /// An HTTP API's OpenAPI document, by URL (a server added at run time
    /// reads no file on the gateway's host).
    pub openapi: Option<String>,
    /// Where an `openapi` server's requests go; default: the document's
    /// first `servers` entry.
    pub base_url: Option<String>,
    /// Connect now (default true).
    pub autoconnect: Option<bool>,
    /// Write it into this replica's config file too, so that it outlives a
    /// restart (default false).
    #[serde(default)]
    pub persist: bool,
}

/// What `POST /admin/servers` (and the console's form) may add at run time.
/// Off by default: an admin token that can add any command or URL can run
/// code on the gateway's host or reach its private network.
#[derive(Debug, Clone, Default)]
pub struct RuntimeServers {
    pub allow: bool,
    /// Globs a stdio server's command must match; none: no stdio servers.
    pub allowed_commands: Vec<String>,
    /// Host names (or addresses) an HTTP server may use although they are,
    /// or resolve to, loopback, private or link-local addresses.
    pub allowed_hosts: Vec<String>,
}

impl RuntimeServers {
    fn check_command(&self, command: &str) -> Result<()> {
        if self
            .allowed_commands
            .iter()
            .any(|glob| manifold_store::glob_match(glob, command))
        {
            return Ok(());
        }
        Err(AdminError::Forbidden(format!(
            "command {command:?} is not in [admin] allowed_commands"
        )))
    }

    /// Refuses a URL whose host resolves to an address a runtime server may
    /// not reach, before anything is connected or written. The connection
    /// checks again, at every connect ([`manifold_upstream::address`]).
    async fn check_url(&self, url: &str) -> Result<()> {
        use manifold_upstream::address::{AddressRefused, SystemResolver, check_url};
        match check_url(url, &self.allowed_hosts, &SystemResolver).await {
            Ok(_) => Ok(()),
            Err(refused @ AddressRefused::Private { .. }) => {
                Err(AdminError::Forbidden(refused.to_string()))
            }
            Err(AddressRefused::Invalid(why)) => Err(AdminError::Invalid(why)),
        }
    }
}

pub async fn add_server(state: &GatewayState, add: AddServer) -> Result<ServerInfo> {
    let policy = &state.config.runtime_servers;
    if !policy.allow {
        return Err(AdminError::Forbidden(
            "adding servers at run time is off ([admin] allow_runtime_servers = false); \
             add it to the config file instead"
                .into(),
        ));
    }
    let mut config = match (&add.command, &add.url, &add.openapi) {
        (Some(command), None, None) => {
            let args: Vec<&str> = add.args.iter().map(String::as_str).collect();
            UpstreamConfig::stdio(&add.name, command, &args)
        }
        (None, Some(url), None) if add.args.is_empty() => {
            let mut config = UpstreamConfig::http(&add.name, url);
            config.transport = match add.transport.as_deref() {
                None => None,
                Some("auto") => Some(HttpTransport::Auto),
                Some("streamable_http") => Some(HttpTransport::StreamableHttp),
                Some("sse") => Some(HttpTransport::Sse),
                Some(other) => {
                    return Err(AdminError::Invalid(format!(
                        "transport {other:?} is not one of auto, streamable_http, sse"
                    )));
                }
            };
            config
        }
        (None, None, Some(document)) if add.args.is_empty() => {
            let mut config = UpstreamConfig::openapi(&add.name, document);
            config.base_url = add.base_url.clone();
            config
        }
        _ => {
            return Err(AdminError::Invalid(
                "give one of command (with args), url or openapi".into(),
            ));
        }
    };
    if add.transport.is_some() && add.url.is_none() {
        return Err(AdminError::Invalid(
            "transport belongs to a url server".into(),
        ));
    }
    if add.base_url.is_some() && add.openapi.is_none() {
        return Err(AdminError::Invalid(
            "base_url belongs to an openapi server".into(),
        ));
    }
    config.description = add.description.clone();
    config.autoconnect = add.autoconnect.unwrap_or(true);
    config.origin = manifold_upstream::ServerOrigin::Runtime;
    config.allowed_private_hosts = policy.allowed_hosts.clone();
    config.validate().map_err(AdminError::Invalid)?;
    if state.catalog.upstream(&config.name).is_some() {
        return Err(AdminError::Conflict(format!(
            "a server named '{}' exists",
            config.name
        )));
    }
    // Checked before anything is spawned, connected or written.
    match (&config.command, &config.url, &config.openapi) {
        (Some(command), _, _) => policy.check_command(command)?,
        (None, Some(url), _) => policy.check_url(url).await?,
        (None, None, Some(document)) => {
            if !(document.starts_with("https://") || document.starts_with("http://")) {
                return Err(AdminError::Invalid(
                    "a server added at run time names its OpenAPI document by URL".into(),
                ));
            }
            policy.check_url(document).await?;
            if let Some(base_url) = &config.base_url {
                policy.check_url(base_url).await?;
            }
        }
        (None, None, None) => {}
    }
    if add.persist {
        // The file's reload starts it, as if the operator had edited the
        // file; `origin = "runtime"` keeps its address checked at every
        // connect, after a restart too.
        let file = state.server_file().ok_or_else(no_server_file)?;
        file.add(ServerEntry {
            name: config.name.clone(),
            description: add.description,
            command: add.command,
            args: add.args,
            url: add.url,
            transport: add.transport,
            openapi: add.openapi,
            base_url: add.base_url,
            autoconnect: config.autoconnect,
        })
        .await?;
        return server(state, &config.name).await;
    }
    let events = state
        .upstream_events()
        .ok_or_else(|| AdminError::Conflict("this gateway cannot add servers".into()))?;
    let autoconnect = config.autoconnect;
    let name = config.name.clone();
    state
        .catalog
        .insert_server(Upstream::new(config, events.clone(), state.oauth().clone()));
    if autoconnect {
        // A failed connect shows in the server's state, as at start-up.
        let _ = set_enabled(state, &name, true).await;
    }
    server(state, &name).await
}

fn no_server_file() -> AdminError {
    AdminError::Conflict("this gateway has no config file to write servers to".into())
}

/// Takes a server out of this replica's config file, and so out of the
/// running gateway: calls in flight finish on its old connection.
pub async fn remove_server(state: &GatewayState, name: &str) -> Result<()> {
    if !state.config.runtime_servers.allow {
        return Err(AdminError::Forbidden(
            "changing servers at run time is off ([admin] allow_runtime_servers = false); \
             edit the config file instead"
                .into(),
        ));
    }
    let file = state.server_file().ok_or_else(no_server_file)?;
    file.remove(name).await
}

/// A server to write into the config file; checked by [`add_server`]
/// before it gets here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerEntry {
    pub name: String,
    pub description: String,
    /// A stdio server's command, or else `url`.
    pub command: Option<String>,
    pub args: Vec<String>,
    pub url: Option<String>,
    pub transport: Option<String>,
    /// An OpenAPI server's document, with where its requests go.
    pub openapi: Option<String>,
    pub base_url: Option<String>,
    /// Written only when false (true is the default).
    pub autoconnect: bool,
}

/// The gateway's own config file, as the admin API and the console change
/// its `[[servers]]`. Each replica has its own, so a change here reaches
/// this replica only. This crate does not know the config format: the
/// `manifold` binary owns it and hands the gateway an implementation that
/// edits the file with the same code as `manifold servers add|remove`
/// (comments kept, the result loaded before it is written) and then applies
/// it through its reload, so the server runs, or stops, before the request
/// is answered, and stays that way after a restart.
pub trait ServerFile: Send + Sync {
    /// Appends the server and applies the file. `Conflict` when the file
    /// already names it, `Invalid` when the result would not load.
    fn add(&self, server: ServerEntry) -> BoxFuture<'_, Result<(), AdminError>>;
    /// Removes the server and applies the file. `NotFound` when the file
    /// does not name it.
    fn remove<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), AdminError>>;
}

// ----------------------------------------------------------------- catalog

/// One tool as the operator sees it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolSummary {
    /// The name callers use (`server__tool`).
    pub name: String,
    pub server: String,
    /// The upstream's own name.
    pub tool: String,
    pub description: String,
    /// The tier policy treats it as: `read_only`, `write` or `destructive`.
    pub tier: String,
    /// `operator` (classified) or `annotations` (the upstream's hints).
    pub tier_source: String,
    /// `approved` or `quarantined`.
    pub status: String,
    /// Why it is quarantined: `not_approved` or `definition_changed`.
    pub quarantine_reason: Option<String>,
    /// SHA-256 of the definition.
    pub hash: String,
    pub tokens: usize,
}

/// A tool's page: the summary, the definition and its code-mode stub.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolDetail {
    pub summary: ToolSummary,
    pub title: Option<String>,
    /// The whole description.
    pub description: String,
    #[schema(value_type = Object)]
    pub input_schema: Value,
    #[schema(value_type = Option<Object>)]
    pub output_schema: Option<Value>,
    /// The upstream's annotations, as sent.
    #[schema(value_type = Option<Object>)]
    pub annotations: Option<Value>,
    /// Always false: annotations are hints.
    pub annotations_trusted: bool,
    /// The definition hash an operator approved, if any.
    pub approved_hash: Option<String>,
    /// TypeScript declaration of the tool's code-mode stub.
    pub typescript: String,
}

fn summary(
    state: &GatewayState,
    tool: &CatalogTool,
    class: Option<&ToolClassification>,
) -> ToolSummary {
    let reason = state.governance().quarantine_reason(tool, class);
    ToolSummary {
        name: tool.qualified.clone(),
        server: tool.server.clone(),
        tool: tool.upstream_name.clone(),
        description: manifold_catalog::one_line(tool.description()),
        tier: state.governance().tier_of(tool, class).as_str().to_string(),
        tier_source: if class.is_some_and(|c| c.tier.is_some()) {
            "operator"
        } else {
            "annotations"
        }
        .to_string(),
        status: if reason.is_some() {
            "quarantined"
        } else {
            "approved"
        }
        .to_string(),
        quarantine_reason: reason.map(|r| r.as_str().to_string()),
        hash: tool.hash.clone(),
        tokens: tool.tokens(),
    }
}

/// Tools of enabled servers, by name; `server` and `query` (a substring of
/// name or description) narrow it.
pub async fn tools(
    state: &GatewayState,
    server: Option<&str>,
    query: Option<&str>,
) -> Result<Vec<ToolSummary>> {
    let view = admin_view(state).await;
    let inputs = state.governance().observe_view(&view).await?;
    let classes = manifold_broker::policy::classifications_by_tool(&inputs);
    let query = query.map(str::to_lowercase).filter(|q| !q.is_empty());
    let mut out: Vec<ToolSummary> = view
        .tools()
        .filter(|t| server.is_none_or(|s| t.server == s))
        .filter(|t| {
            query.as_deref().is_none_or(|q| {
                t.qualified.to_lowercase().contains(q) || t.description().to_lowercase().contains(q)
            })
        })
        .map(|t| {
            let class = classes
                .get(&(t.server.as_str(), t.upstream_name.as_str()))
                .copied();
            summary(state, t, class)
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

pub async fn tool(state: &GatewayState, server: &str, name: &str) -> Result<ToolDetail> {
    let view = admin_view(state).await;
    let inputs = state.governance().observe_view(&view).await?;
    let tool = view
        .tools()
        .find(|t| t.server == server && (t.upstream_name == name || t.name == name))
        .ok_or_else(|| AdminError::NotFound(format!("no tool {server}/{name}")))?;
    let class = inputs
        .classifications
        .iter()
        .find(|c| c.server == server && c.tool == tool.upstream_name);
    let def = &tool.definition;
    let bindings = match state.code_mode() {
        Some(code_mode) => code_mode.bindings(&view),
        None => Arc::new(crate::mcp::discovery::script_bindings(&view)),
    };
    Ok(ToolDetail {
        summary: summary(state, tool, class),
        title: def.title.clone(),
        description: tool.description().to_string(),
        input_schema: Value::Object((*def.input_schema).clone()),
        output_schema: def
            .output_schema
            .as_ref()
            .map(|s| Value::Object((**s).clone())),
        annotations: def
            .annotations
            .as_ref()
            .and_then(|a| serde_json::to_value(a).ok()),
        annotations_trusted: false,
        approved_hash: class.and_then(|c| c.approved_hash.clone()),
        typescript: crate::mcp::discovery::typescript(&[tool.as_ref()], &bindings),
    })
}

/// [`tool`] by the qualified name callers use.
pub async fn tool_named(state: &GatewayState, qualified: &str) -> Result<ToolDetail> {
    let view = admin_view(state).await;
    let found = view
        .tool(qualified)
        .map(|t| (t.server.clone(), t.upstream_name.clone()))
        .ok_or_else(|| AdminError::NotFound(format!("no tool {qualified}")))?;
    tool(state, &found.0, &found.1).await
}

/// One server's calls, errors, refusals and median latency over the last
/// hour, by minute, from the activity audit (one bounded statement, so
/// every replica on one database shows the same chart).
pub async fn server_chart(state: &GatewayState, name: &str) -> Result<manifold_store::CallChart> {
    // Unqualified names (a single-server gateway) carry no server prefix.
    let prefix = if state.catalog.qualifies_names() {
        format!("{name}__")
    } else {
        String::new()
    };
    Ok(state
        .governance()
        .store()
        .call_chart(&prefix, now_ms())
        .await?)
}

/// A call from the console's playground and the activity row it left.
pub struct PlaygroundCall {
    pub outcome: std::result::Result<rmcp::model::CallToolResponse, manifold_broker::BrokerError>,
    pub audit: Option<Value>,
}

/// Calls `tool` as `caller` (the signed-in operator) through the broker, so
/// token, policy, quarantine, rate limits, approvals, validation and audit
/// apply as to any caller. Like `POST /call`, the call runs in its own task,
/// so a closed page does not abandon it half-way.
pub async fn playground_call(
    state: &GatewayState,
    caller: &manifold_broker::Caller,
    tool: &str,
    arguments: rmcp::model::JsonObject,
) -> Result<PlaygroundCall> {
    let started = now_ms();
    let broker = Arc::clone(&state.broker);
    let (task_caller, task_tool) = (caller.clone(), tool.to_string());
    let outcome = tokio::spawn(async move {
        broker
            .call(manifold_broker::CallRequest {
                caller: &task_caller,
                tool: &task_tool,
                arguments: Some(arguments),
                approval_id: None,
                provenance: None,
                context: Default::default(),
            })
            .await
    })
    .await
    .map_err(|e| AdminError::Upstream(format!("the call task failed: {e}")))?;
    // With `audit_commit = "async"` the row may still be queued.
    state.governance().flush_audit().await;
    let audit = state
        .governance()
        .store()
        .latest_call(&caller.name, tool, started)
        .await?;
    Ok(PlaygroundCall { outcome, audit })
}

// ------------------------------------------------------------------ search

/// One strategy's ranking in a comparison.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StrategyResult {
    /// The strategy asked for.
    pub requested: String,
    /// The strategy that really ranked (hybrid without vectors is bm25).
    pub strategy: Option<String>,
    pub took_ms: f64,
    pub hits: Vec<SearchHit>,
    /// Why this strategy could not run.
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SearchHit {
    pub name: String,
    pub server: String,
    pub description: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SearchComparison {
    pub query: String,
    pub results: Vec<StrategyResult>,
}

/// Runs `query` with each strategy over the whole catalog, side by side.
pub async fn compare_search(
    state: &GatewayState,
    query: &str,
    strategies: &[Strategy],
    limit: usize,
) -> Result<SearchComparison> {
    if query.trim().is_empty() {
        return Err(AdminError::Invalid("the query is empty".into()));
    }
    if strategies.is_empty() {
        return Err(AdminError::Invalid("name at least one strategy".into()));
    }
    let visible = Visible {
        view: admin_view(state).await,
        needs_approval: Default::default(),
    };
    let limit = limit.clamp(1, state.config.max_limit);
    let run = || {
        strategies
            .iter()
            .map(|&strategy| {
                let started = std::time::Instant::now();
                let outcome =
                    state
                        .discovery
                        .search(&visible, query, strategy, limit, None, Detail::Summary);
                let took_ms = started.elapsed().as_secs_f64() * 1000.0;
                match outcome {
                    Ok(outcome) => StrategyResult {
                        requested: strategy.to_string(),
                        strategy: Some(outcome.strategy.to_string()),
                        took_ms,
                        hits: outcome
                            .servers
                            .iter()
                            .flat_map(|group| {
                                let server = group["server"].as_str().unwrap_or("").to_string();
                                group["tools"]
                                    .as_array()
                                    .cloned()
                                    .unwrap_or_default()
                                    .into_iter()
                                    .map(move |t| SearchHit {
                                        name: t["name"].as_str().unwrap_or("").to_string(),
                                        server: server.clone(),
                                        description: t["description"]
                                            .as_str()
                                            .unwrap_or("")
                                            .to_string(),
                                    })
                            })
                            .collect(),
                        error: None,
                    },
                    Err(e) => StrategyResult {
                        requested: strategy.to_string(),
                        strategy: None,
                        took_ms,
                        hits: Vec::new(),
                        error: Some(e.to_string()),
                    },
                }
            })
            .collect::<Vec<_>>()
    };
    // Embedding a query blocks; keep it off the runtime's other tasks.
    let results = if state.discovery.may_block()
        && tokio::runtime::Handle::current().runtime_flavor()
            == tokio::runtime::RuntimeFlavor::MultiThread
    {
        tokio::task::block_in_place(run)
    } else {
        run()
    };
    Ok(SearchComparison {
        query: query.to_string(),
        results,
    })
}
