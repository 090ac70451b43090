//! The sections that shape what the gateway serves: `[gateway]`,
//! `[admission]`, `[admin]` and `[search]`.

use std::path::Path;

use manifold_search::Strategy;
use serde::Deserialize;

/// `[gateway]`: where and how the gateway serves.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    #[serde(default = "default_listen")]
    pub listen: String,
    #[serde(default)]
    pub mode: ModeSetting,
    #[serde(default = "default_context_window")]
    pub context_window_tokens: usize,
    #[serde(default = "default_threshold")]
    pub threshold_percent: f64,
    /// `server__tool` names; a single-server set-up may turn this off.
    #[serde(default = "crate::yes")]
    pub qualify_names: bool,
    /// `search_tools`' default strategy: `hybrid` (the default; BM25F when
    /// no embedding model is loaded), `bm25`, `embedding`, `regex` or
    /// `rerank` (needs `[search.rerank]`).
    #[serde(default)]
    pub search_strategy: Strategy,
    /// Host names accepted on `/mcp` besides loopback (DNS-rebinding guard).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// On SIGTERM, how long in-flight requests may take to finish before
    /// the gateway stops anyway.
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout_ms: u64,
    /// Give legacy (2025-11-25 and older) HTTP clients a session, which
    /// sampling and elicitation requests to them need. Off: every request is
    /// stateless and GET/DELETE on `/mcp` are 405. 2026-07-28 clients are
    /// stateless either way.
    #[serde(default)]
    pub legacy_sessions: bool,
    /// Answer plain direct-mode `tools/call` requests of session-free
    /// clients without rmcp's per-request machinery (same wire, less CPU).
    /// Off: every request goes through rmcp.
    #[serde(default = "crate::yes")]
    pub fast_calls: bool,
    /// At most this many legacy HTTP+SSE streams (`GET /sse`) are open on
    /// this replica; past it, 503.
    #[serde(default = "default_max_sse_sessions")]
    pub max_sse_sessions: usize,
    /// A legacy SSE stream with no message either way for this long closes.
    #[serde(default = "default_sse_idle_timeout")]
    pub sse_idle_timeout_seconds: u64,
    /// Request bodies over this many bytes are refused with 413.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// Where users reach this gateway (`https://gw.example.com`), behind
    /// any proxy. An https URL marks the console's cookie `Secure` with the
    /// `__Host-` prefix.
    #[serde(default)]
    pub public_url: Option<String>,
    /// A console sign-in ends after this many minutes without a request.
    #[serde(default = "default_console_idle")]
    pub console_idle_minutes: u64,
    /// ... and this many hours after sign-in, however busy.
    #[serde(default = "default_console_hours")]
    pub console_session_hours: u64,
    /// How long a task (the `io.modelcontextprotocol/tasks` extension) the
    /// gateway hands out stays readable; an upstream's shorter TTL wins.
    #[serde(default = "default_task_ttl")]
    pub task_ttl_seconds: u64,
    /// A call of a caller that declared the tasks extension, to an upstream
    /// without it, becomes a task the gateway makes once it has run this
    /// long.
    #[serde(default = "default_task_after")]
    pub task_after_ms: u64,
    /// At most this many gateway-made tasks of one principal are working at
    /// once; past it a call is not turned into a task.
    #[serde(default = "default_max_tasks")]
    pub max_tasks_per_principal: u64,
    /// A gateway-made task's result larger than this (as JSON) is not kept:
    /// the task fails and says so.
    #[serde(default = "default_max_task_result")]
    pub max_task_result_bytes: usize,
}

fn default_task_after() -> u64 {
    1000
}

fn default_max_tasks() -> u64 {
    64
}

fn default_max_task_result() -> usize {
    4 * 1024 * 1024
}

fn default_task_ttl() -> u64 {
    3600
}

fn default_console_idle() -> u64 {
    30
}
fn default_console_hours() -> u64 {
    12
}

impl Default for GatewayConfig {
    fn default() -> Self {
        toml::from_str("").expect("empty gateway config is valid")
    }
}

fn default_max_sse_sessions() -> usize {
    256
}
fn default_sse_idle_timeout() -> u64 {
    300
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
fn default_max_body_bytes() -> usize {
    4 * 1024 * 1024
}
fn default_drain_timeout() -> u64 {
    30_000
}
fn default_context_window() -> usize {
    200_000
}
fn default_threshold() -> f64 {
    2.0
}

/// `[gateway] mode`: how tools reach the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ModeSetting {
    /// Decide from the size of the catalog.
    #[default]
    Auto,
    /// Expose every tool under its qualified name.
    Direct,
    /// Expose only the meta-tools.
    Progressive,
}

/// Bounds on concurrent discovery (`tools/list`, `server/discover`,
/// `search_tools`, `get_tool_details`, `search_available_servers`) over HTTP.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionSection {
    #[serde(default = "default_max_active")]
    pub max_active: usize,
    #[serde(default = "default_max_queued")]
    pub max_queued: usize,
    #[serde(default = "default_retry_after")]
    pub retry_after_seconds: u64,
}

impl Default for AdmissionSection {
    fn default() -> Self {
        toml::from_str("").expect("empty admission config is valid")
    }
}

fn default_max_active() -> usize {
    2
}
fn default_max_queued() -> usize {
    32
}
fn default_retry_after() -> u64 {
    1
}

/// `[search]`: the embedding model behind the `embedding` and `hybrid`
/// strategies (`[search.embedding]`, see `manifold_embed::EmbeddingConfig`)
/// and the optional reranker (`[search.rerank]`).
/// The default strategy is `[gateway] search_strategy`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchSection {
    #[serde(default)]
    pub embedding: manifold_embed::EmbeddingConfig,
    /// The optional `rerank` strategy's chat endpoint; off when absent.
    #[serde(default)]
    pub rerank: Option<manifold_embed::RerankConfig>,
}

impl SearchSection {
    /// The embedding config with relative `model_dir` and `cache_dir`
    /// resolved against the config's folder.
    pub fn embedding_resolved(&self, base: &Path) -> manifold_embed::EmbeddingConfig {
        let mut e = self.embedding.clone();
        for dir in [&mut e.model_dir, &mut e.cache_dir].into_iter().flatten() {
            if dir.is_relative() {
                *dir = base.join(&*dir);
            }
        }
        e
    }
}

/// What the admin API may change while the gateway runs.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminSection {
    /// Let `POST /admin/servers` (and the console) add servers at run time.
    pub allow_runtime_servers: bool,
    /// Globs a runtime-added stdio server's command must match.
    pub allowed_commands: Vec<String>,
    /// Hosts a runtime-added HTTP server may use although they are, or
    /// resolve to, loopback, private or link-local addresses.
    pub allowed_hosts: Vec<String>,
}
