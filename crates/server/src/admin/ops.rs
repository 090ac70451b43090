//! What an operator can do, as plain functions over the gateway state or the
//! store. The admin API, the console and the `manifold` CLI all call these, so
//! each operation has one implementation; handlers and commands only parse
//! input and render output.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use futures::future::BoxFuture;
use manifold_broker::Visible;
use manifold_catalog::{CatalogTool, Principal};
use manifold_search::Strategy;
use manifold_store::{
    Action, Approval, ApprovalError, AuditKind, Effect, Expiry, NewPolicy, NewToken, Policy,
    PrincipalSelector, RiskTier, Store, StoreError, TierSelector, TokenRecord, ToolClassification,
    now_ms,
};
use manifold_upstream::{Upstream, UpstreamConfig, UpstreamState, UpstreamStatus};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::{Detail, GatewayState, Mode};

/// Why an admin operation failed; the API maps each kind to a status code.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// Refused whoever asks the same way (a decider approving its own request).
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    Upstream(String),
    #[error("the store is unavailable: {0}")]
    Store(StoreError),
}

impl From<StoreError> for AdminError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Invalid { .. } => AdminError::Invalid(e.to_string()),
            StoreError::NotFound { .. } => AdminError::NotFound(e.to_string()),
            StoreError::Conflict(_) => AdminError::Conflict(e.to_string()),
            other => AdminError::Store(other),
        }
    }
}

pub type Result<T, E = AdminError> = std::result::Result<T, E>;

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
    }
}

pub async fn servers(state: &GatewayState) -> Vec<ServerInfo> {
    let view = admin_view(state).await;
    let mut out: Vec<ServerInfo> = state
        .catalog
        .statuses()
        .into_iter()
        .map(|(status, enabled)| server_info(status, enabled, &view))
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
    /// A Streamable HTTP server's URL.
    pub url: Option<String>,
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

    /// Resolves the URL's host once and checks every address; returns the
    /// address the connection must go to, so a second lookup cannot swap a
    /// checked public address for a private one (DNS rebinding).
    async fn check_url(&self, url: &str) -> Result<std::net::SocketAddr> {
        let parsed: axum::http::Uri = url
            .parse()
            .map_err(|e| AdminError::Invalid(format!("invalid url {url:?}: {e}")))?;
        let default_port = match parsed.scheme_str() {
            Some("http") => 80,
            Some("https") => 443,
            _ => {
                return Err(AdminError::Invalid(format!(
                    "url {url:?} must be http or https"
                )));
            }
        };
        let host = parsed
            .host()
            .ok_or_else(|| AdminError::Invalid(format!("url {url:?} has no host")))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = parsed.port_u16().unwrap_or(default_port);
        let named = self
            .allowed_hosts
            .iter()
            .any(|h| h.eq_ignore_ascii_case(&host));
        let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| AdminError::Invalid(format!("cannot resolve {host:?}: {e}")))?
            .collect();
        let first = *addrs
            .first()
            .ok_or_else(|| AdminError::Invalid(format!("{host:?} resolves to no address")))?;
        if !named && let Some(bad) = addrs.iter().find(|a| !is_public(a.ip())) {
            return Err(AdminError::Forbidden(format!(
                "{host:?} resolves to {}, a loopback, private or link-local address; \
                 name it in [admin] allowed_hosts to allow it",
                bad.ip()
            )));
        }
        Ok(first)
    }
}

/// Whether an address is one a runtime-added server may reach without being
/// named: not loopback, private, link-local, shared, unspecified, multicast
/// or documentation space.
fn is_public(ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b)))
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80)
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
    let mut config = match (&add.command, &add.url) {
        (Some(command), None) => {
            let args: Vec<&str> = add.args.iter().map(String::as_str).collect();
            UpstreamConfig::stdio(&add.name, command, &args)
        }
        (None, Some(url)) if add.args.is_empty() => UpstreamConfig::http(&add.name, url),
        _ => {
            return Err(AdminError::Invalid(
                "give either command (with args) or url".into(),
            ));
        }
    };
    config.description = add.description.clone();
    config.autoconnect = add.autoconnect.unwrap_or(true);
    config.validate().map_err(AdminError::Invalid)?;
    if state.catalog.upstream(&config.name).is_some() {
        return Err(AdminError::Conflict(format!(
            "a server named '{}' exists",
            config.name
        )));
    }
    // Checked before anything is spawned, connected or written.
    match (&config.command, &config.url) {
        (Some(command), _) => policy.check_command(command)?,
        (None, Some(url)) => config.pinned_addr = Some(policy.check_url(url).await?),
        (None, None) => {}
    }
    if add.persist {
        // The file's reload starts it, as if the operator had edited the
        // file; a later start resolves the URL again, like any configured
        // server (the pinned address lives only in this process).
        let file = state.server_file().ok_or_else(no_server_file)?;
        file.add(ServerEntry {
            name: config.name.clone(),
            description: add.description,
            command: add.command,
            args: add.args,
            url: add.url,
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
        description: crate::mcp::discovery::one_line(tool.description()),
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
        .find(|t| t.server == server && t.upstream_name == name)
        .ok_or_else(|| AdminError::NotFound(format!("no tool {server}/{name}")))?;
    let class = inputs
        .classifications
        .iter()
        .find(|c| c.server == server && c.tool == name);
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

/// How many leading digits of a definition hash identify it (what `tools
/// list` shows, and the least an approval accepts).
pub const HASH_PREFIX: usize = 12;

/// What an operator does to one tool.
#[derive(Debug, Clone)]
pub enum ToolAction {
    /// Approve the definition the operator reviewed (its hash, or a prefix
    /// of at least [`HASH_PREFIX`] digits), lifting quarantine. Refused when
    /// the definition has changed since.
    Approve {
        reviewed_hash: String,
    },
    Quarantine,
    /// Set (or with `None` clear) the tier.
    Classify(Option<RiskTier>),
}

pub async fn tool_action(
    store: &Store,
    server: &str,
    tool: &str,
    action: ToolAction,
) -> Result<ToolClassification> {
    Ok(match action {
        ToolAction::Approve { reviewed_hash } => {
            let known = store
                .tool_classification(server, tool)
                .await?
                .ok_or_else(|| AdminError::NotFound(format!("no recorded tool {server}/{tool}")))?;
            let reviewed = reviewed_hash.trim();
            if reviewed.len() < HASH_PREFIX {
                return Err(AdminError::Invalid(format!(
                    "give the definition hash you reviewed (at least {HASH_PREFIX} digits)"
                )));
            }
            if !known.definition_hash.starts_with(reviewed) {
                return Err(AdminError::Conflict(format!(
                    "{server}/{tool} changed since it was reviewed: reviewed definition {reviewed}, \
                     current definition {}; review the current one and approve its hash",
                    known.definition_hash
                )));
            }
            // The store checks the full hash again in the same statement, so
            // a change between this read and the update is refused too.
            store
                .approve_tool(server, tool, &known.definition_hash)
                .await?
        }
        ToolAction::Quarantine => store.quarantine_tool(server, tool).await?,
        ToolAction::Classify(tier) => store.classify_tool(server, tool, tier).await?,
    })
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

// ------------------------------------------------------------------ tokens

/// `30d`, `12h`, `90m`, `45s`, or bare seconds. Zero is refused: every use
/// (expiry, rate window, "since") needs a positive span.
pub fn parse_duration(text: &str) -> Result<Duration> {
    let text = text.trim();
    let invalid = || {
        AdminError::Invalid(format!(
            "invalid duration '{text}' (expected e.g. 30d, 12h, 90m, 45s or seconds)"
        ))
    };
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let scale: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 60 * 60,
        "d" => 24 * 60 * 60,
        _ => return Err(invalid()),
    };
    let n: u64 = digits.parse().map_err(|_| invalid())?;
    let secs = n
        .checked_mul(scale)
        .ok_or_else(|| AdminError::Invalid(format!("duration '{text}' is too long")))?;
    if secs == 0 {
        return Err(AdminError::Invalid(format!(
            "duration '{text}' must be greater than zero"
        )));
    }
    Ok(Duration::from_secs(secs))
}

/// A token to create.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    pub name: String,
    /// `30d`, `12h`, `90m`, `45s`, seconds, or `never`. Default: 90 days.
    pub expires: Option<String>,
    /// `discover`, `call`, `code`, `admin`. Default: discover, call, code.
    #[serde(default)]
    pub actions: Vec<String>,
    /// Globs over `server__tool`. Default: `*`.
    #[serde(default)]
    pub scopes: Vec<String>,
    #[serde(default)]
    pub groups: Vec<String>,
}

/// A token as listed; the secret is never stored, so never shown.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TokenInfo {
    pub id: String,
    pub name: String,
    pub actions: Vec<String>,
    pub scopes: Vec<String>,
    pub groups: Vec<String>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    /// RFC 3339, or `never`.
    pub expires: String,
    pub revoked_at: Option<i64>,
    /// `active`, `expired` or `revoked`.
    pub state: String,
}

/// A new token with its secret, shown this once; otherwise as listed.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CreatedToken {
    /// `mfd_<id>_<secret>`: send it as `Authorization: Bearer`.
    pub token: String,
    pub id: String,
    pub name: String,
    pub actions: Vec<String>,
    pub scopes: Vec<String>,
    pub groups: Vec<String>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub expires: String,
    pub revoked_at: Option<i64>,
    pub state: String,
}

impl CreatedToken {
    fn new(token: String, info: TokenInfo) -> CreatedToken {
        CreatedToken {
            token,
            id: info.id,
            name: info.name,
            actions: info.actions,
            scopes: info.scopes,
            groups: info.groups,
            created_at: info.created_at,
            expires_at: info.expires_at,
            expires: info.expires,
            revoked_at: info.revoked_at,
            state: info.state,
        }
    }
}

fn token_state(t: &TokenRecord, now: i64) -> &'static str {
    if t.is_revoked() {
        "revoked"
    } else if t.is_expired(now) {
        "expired"
    } else {
        "active"
    }
}

pub fn token_info(t: &TokenRecord, groups: Vec<String>, now: i64) -> TokenInfo {
    TokenInfo {
        id: t.id.clone(),
        name: t.name.clone(),
        actions: t.actions.iter().map(|a| a.as_str().to_string()).collect(),
        scopes: t.scopes.clone(),
        groups,
        created_at: t.created_at,
        expires_at: t.expires_at,
        expires: t.expires_at.map_or_else(|| "never".to_string(), format_ms),
        revoked_at: t.revoked_at,
        state: token_state(t, now).to_string(),
    }
}

pub async fn create_token(store: &Store, request: CreateToken) -> Result<CreatedToken> {
    let expiry = match request.expires.as_deref().map(str::trim) {
        None | Some("") => Expiry::Default,
        Some("never") => Expiry::Never,
        Some(d) => Expiry::After(parse_duration(d)?),
    };
    let actions: BTreeSet<Action> = if request.actions.is_empty() {
        [Action::Discover, Action::Call, Action::Code].into()
    } else {
        request
            .actions
            .iter()
            .map(|a| a.parse::<Action>())
            .collect::<Result<_, _>>()?
    };
    let scopes = if request.scopes.is_empty() {
        vec!["*".to_string()]
    } else {
        request.scopes
    };
    let new = NewToken::new(request.name, actions, scopes).expiry(expiry);
    let (record, secret) = store.create_token(new).await?;
    for group in &request.groups {
        if let Err(e) = store.add_token_group(&record.id, group).await {
            // No half-made token: its secret would never be shown.
            let _ = store.delete_token(&record.id).await;
            return Err(e.into());
        }
    }
    let groups: BTreeSet<String> = request.groups.into_iter().collect();
    Ok(CreatedToken::new(
        secret,
        token_info(&record, groups.into_iter().collect(), now_ms()),
    ))
}

pub async fn list_tokens(store: &Store) -> Result<Vec<TokenInfo>> {
    let tokens = store.list_tokens().await?;
    let inputs = store.load_policy_inputs().await?;
    let now = now_ms();
    Ok(tokens
        .iter()
        .map(|t| token_info(t, inputs.groups_of(&t.id).into_iter().collect(), now))
        .collect())
}

pub async fn revoke_token(store: &Store, id: &str) -> Result<TokenInfo> {
    if !store.revoke_token(id).await? {
        return match store.get_token(id).await? {
            Some(_) => Err(AdminError::Conflict(format!(
                "token '{id}' is already revoked"
            ))),
            None => Err(AdminError::NotFound(format!("no token with id '{id}'"))),
        };
    }
    let token = store
        .get_token(id)
        .await?
        .ok_or_else(|| AdminError::NotFound(format!("no token with id '{id}'")))?;
    let groups = store.token_groups(id).await?;
    Ok(token_info(&token, groups, now_ms()))
}

// ---------------------------------------------------------------- policies

/// A rule to create, or the new contents of one.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyInput {
    /// `allow`, `deny`, `require_approval` or `rate_limit`.
    pub effect: String,
    /// `*`, `token:<id>`, `user:<id>` or `group:<name>`. Default `*`.
    pub principal: Option<String>,
    /// Glob over server names. Default `*`.
    pub server: Option<String>,
    /// Glob over tool names (unqualified). Default `*`.
    pub tool: Option<String>,
    /// `any`, `read_only`, `write` or `destructive`. Default `any`.
    pub tier: Option<String>,
    /// Calls per window (rate_limit only).
    pub limit: Option<u32>,
    /// Window length in seconds (rate_limit only).
    pub window_seconds: Option<u32>,
    pub description: Option<String>,
}

/// A stored rule.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PolicyInfo {
    pub id: String,
    pub principal: String,
    pub server: String,
    pub tool: String,
    pub tier: String,
    pub effect: String,
    pub limit: Option<u32>,
    pub window_seconds: Option<u32>,
    pub description: String,
    pub created_at: i64,
    /// RFC 3339.
    pub created: String,
}

fn nonempty(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

pub fn new_policy(input: &PolicyInput) -> Result<NewPolicy> {
    let effect = match (input.effect.as_str(), input.limit, input.window_seconds) {
        ("rate_limit", Some(limit), Some(window_seconds)) => Effect::RateLimit {
            limit,
            window_seconds,
        },
        ("rate_limit", _, _) => {
            return Err(AdminError::Invalid(
                "effect rate_limit needs limit and window".into(),
            ));
        }
        (_, Some(_), _) | (_, _, Some(_)) => {
            return Err(AdminError::Invalid(
                "limit and window apply only to effect rate_limit".into(),
            ));
        }
        ("allow", ..) => Effect::Allow,
        ("deny", ..) => Effect::Deny,
        ("require_approval", ..) => Effect::RequireApproval,
        (other, ..) => {
            return Err(AdminError::Invalid(format!(
                "unknown effect '{other}' (expected allow, deny, require_approval or rate_limit)"
            )));
        }
    };
    let principal: PrincipalSelector = nonempty(&input.principal).unwrap_or("*").parse()?;
    let tier: TierSelector = nonempty(&input.tier).unwrap_or("any").parse()?;
    Ok(NewPolicy {
        principal,
        server_glob: nonempty(&input.server).unwrap_or("*").to_string(),
        tool_glob: nonempty(&input.tool).unwrap_or("*").to_string(),
        tier,
        effect,
        description: input.description.clone().unwrap_or_default(),
    })
}

pub fn principal_text(p: &PrincipalSelector) -> String {
    p.to_string()
}

pub fn tier_text(t: TierSelector) -> &'static str {
    match t {
        TierSelector::Any => "any",
        TierSelector::Only(tier) => tier.as_str(),
    }
}

pub fn effect_name(e: Effect) -> &'static str {
    match e {
        Effect::Allow => "allow",
        Effect::Deny => "deny",
        Effect::RequireApproval => "require_approval",
        Effect::RateLimit { .. } => "rate_limit",
    }
}

pub fn policy_info(p: &Policy) -> PolicyInfo {
    let (limit, window_seconds) = match p.effect {
        Effect::RateLimit {
            limit,
            window_seconds,
        } => (Some(limit), Some(window_seconds)),
        _ => (None, None),
    };
    PolicyInfo {
        id: p.id.clone(),
        principal: principal_text(&p.principal),
        server: p.server_glob.clone(),
        tool: p.tool_glob.clone(),
        tier: tier_text(p.tier).to_string(),
        effect: effect_name(p.effect).to_string(),
        limit,
        window_seconds,
        description: p.description.clone(),
        created_at: p.created_at,
        created: format_ms(p.created_at),
    }
}

pub async fn list_policies(store: &Store) -> Result<Vec<PolicyInfo>> {
    Ok(store
        .list_policies()
        .await?
        .iter()
        .map(policy_info)
        .collect())
}

pub async fn create_policy(store: &Store, input: &PolicyInput) -> Result<PolicyInfo> {
    Ok(policy_info(&store.create_policy(new_policy(input)?).await?))
}

pub async fn update_policy(store: &Store, id: &str, input: &PolicyInput) -> Result<PolicyInfo> {
    Ok(policy_info(
        &store.update_policy(id, new_policy(input)?).await?,
    ))
}

pub async fn delete_policy(store: &Store, id: &str) -> Result<()> {
    if store.delete_policy(id).await? {
        Ok(())
    } else {
        Err(AdminError::NotFound(format!("no policy with id '{id}'")))
    }
}

// --------------------------------------------------------------- approvals

/// An approval request.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ApprovalInfo {
    pub id: String,
    /// Who asked: `token:<id>` or `anonymous`.
    pub principal: String,
    /// The qualified tool name.
    pub tool: String,
    pub args_hash: String,
    /// The arguments, secrets redacted as configured.
    #[schema(value_type = Object)]
    pub redacted_args: Value,
    /// `pending`, `approved` or `denied`.
    pub status: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub decided_at: Option<i64>,
    pub decided_by: Option<String>,
    pub consumed_at: Option<i64>,
}

impl From<Approval> for ApprovalInfo {
    fn from(a: Approval) -> Self {
        ApprovalInfo {
            id: a.id,
            principal: a.principal,
            tool: a.tool,
            args_hash: a.args_hash,
            redacted_args: a.redacted_args,
            status: a.status.as_str().to_string(),
            created_at: a.created_at,
            expires_at: a.expires_at,
            decided_at: a.decided_at,
            decided_by: a.decided_by,
            consumed_at: a.consumed_at,
        }
    }
}

pub async fn pending_approvals(store: &Store) -> Result<Vec<ApprovalInfo>> {
    Ok(store
        .list_pending()
        .await?
        .into_iter()
        .map(ApprovalInfo::from)
        .collect())
}

/// Approves or denies; the waiting call sees it at its next poll.
/// `decider` is the gateway principal deciding (the admin API, the
/// console): it may never approve a request it made itself. The CLI is the
/// host operator's path and passes `None`, recording `by`.
pub async fn decide_approval(
    store: &Store,
    id: &str,
    approve: bool,
    by: &str,
    decider: Option<&str>,
) -> Result<ApprovalInfo> {
    if approve
        && let Some(decider) = decider
        && let Some(request) = store.get_approval(id).await?
        && request.principal == decider
    {
        return Err(AdminError::Forbidden(format!(
            "'{decider}' requested approval {id} and cannot approve it; another operator must"
        )));
    }
    match store.decide_approval(id, approve, by).await {
        Ok(approval) => Ok(approval.into()),
        Err(ApprovalError::NotFound) => {
            Err(AdminError::NotFound(format!("no such approval '{id}'")))
        }
        Err(ApprovalError::Store(e)) => Err(e.into()),
        Err(e) => Err(AdminError::Conflict(e.to_string())),
    }
}

// ------------------------------------------------------------------- audit

pub fn audit_kinds(kind: Option<&str>) -> Result<Vec<AuditKind>> {
    match kind.map(str::trim).filter(|k| !k.is_empty() && *k != "all") {
        None => Ok(AuditKind::ALL.to_vec()),
        Some(k) => Ok(vec![k.parse::<AuditKind>()?]),
    }
}

/// By time; ties by trail then row id, so output is stable.
fn sort_rows(rows: &mut [Value]) {
    rows.sort_by_key(|r| {
        (
            r["created_at"].as_i64().unwrap_or(0),
            r["kind"].as_str().unwrap_or("").to_string(),
            r["id"].as_i64().unwrap_or(0),
        )
    });
}

/// The last `n` rows of the trails, merged by time, oldest first.
pub async fn audit_tail(store: &Store, kinds: &[AuditKind], n: usize) -> Result<Vec<Value>> {
    let mut rows = Vec::new();
    for &kind in kinds {
        rows.extend(store.audit_tail(kind, n).await?);
    }
    sort_rows(&mut rows);
    // Each trail gave its last n; the merged tail is the last n of those.
    let skip = rows.len().saturating_sub(n);
    Ok(rows.split_off(skip))
}

/// Every row since `since` (unix ms), merged by time, oldest first.
pub async fn audit_export(store: &Store, kinds: &[AuditKind], since: i64) -> Result<Vec<Value>> {
    let mut rows = Vec::new();
    for &kind in kinds {
        rows.extend(store.audit_export(kind, since).await?);
    }
    sort_rows(&mut rows);
    Ok(rows)
}

/// `since` as a span back from now (`1h`, `7d`) or unix milliseconds.
pub fn parse_since(since: Option<&str>) -> Result<i64> {
    match since.map(str::trim).filter(|s| !s.is_empty()) {
        None => Ok(0),
        Some(ms) if ms.bytes().all(|b| b.is_ascii_digit()) => ms
            .parse()
            .map_err(|_| AdminError::Invalid(format!("invalid since '{ms}'"))),
        Some(span) => {
            let span = parse_duration(span)?;
            Ok(now_ms().saturating_sub(i64::try_from(span.as_millis()).unwrap_or(i64::MAX)))
        }
    }
}

/// One audit row, as the store exports it (the schema of `/admin/audit`'s
/// rows and of each export line). Which fields appear depends on `kind`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AuditRow {
    /// `discovery`, `access` or `activity`.
    pub kind: String,
    pub id: i64,
    pub created_at: i64,
    pub principal: Option<String>,
    pub token_id: Option<String>,
    /// Discovery: how many tools the caller was shown, and their digest.
    pub visible_count: Option<i64>,
    pub visible_digest: Option<String>,
    /// Access: `success` or `failure`; activity: `success`, `error` or `not_forwarded`.
    pub outcome: Option<String>,
    /// Access: why it failed.
    pub reason: Option<String>,
    /// Activity: the qualified tool, the arguments' hash, the decision.
    pub tool: Option<String>,
    pub args_hash: Option<String>,
    /// `allowed`, `denied`, `approval_required`, `approved` or `rate_limited`.
    pub decision: Option<String>,
    pub approval_id: Option<String>,
    pub latency_ms: Option<i64>,
    pub bytes_in: Option<i64>,
    pub bytes_out: Option<i64>,
    #[schema(value_type = Object)]
    pub details: Value,
}

/// Unix milliseconds as RFC 3339 UTC, e.g. `2026-11-30T06:56:10Z`.
pub fn format_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant), valid for the proleptic Gregorian calendar.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
