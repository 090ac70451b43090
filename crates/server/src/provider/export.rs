//! Provider-native discovery: the caller's visible catalog in the shapes of
//! the Anthropic and OpenAI APIs (`manifold-export`), search results in the
//! blocks their client-side searches return, and provider-facing names back
//! to qualified names for the broker.
//!
//! Visibility is the meta-tools' path ([`GatewayState::visible`]). The order
//! is the order tools were first seen (the store's `first_seen_at`, one
//! timestamp per observed batch), then `(server, tool)`: a new tool goes at
//! the end, and nothing already exported moves, so a provider's prompt cache
//! survives catalog changes.

use std::{collections::HashMap, sync::Arc};

use manifold_broker::{Caller, Visible};
use manifold_catalog::{CatalogTool, CatalogView};
use manifold_export::{Export, ExportTool, NamedTool, Provider};
use manifold_search::{Strategy, ToolDoc};
use serde::Deserialize;
use serde_json::Value;

use crate::GatewayState;

/// Why an export or a provider search could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Refused(#[from] manifold_broker::Refusal),
    #[error("store unavailable: {0}")]
    Store(#[from] manifold_store::StoreError),
    #[error("{0}")]
    Search(#[from] manifold_search::SearchError),
}

/// The search result formats of `search_tools` and `POST /search`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum SearchFormat {
    #[serde(rename = "anthropic_tool_reference")]
    AnthropicToolReference,
    #[serde(rename = "openai_tool_search_output")]
    OpenAiToolSearchOutput,
}

impl SearchFormat {
    pub fn provider(self) -> Provider {
        match self {
            SearchFormat::AnthropicToolReference => Provider::Anthropic,
            SearchFormat::OpenAiToolSearchOutput => Provider::OpenAi,
        }
    }
}

/// A tool with what its export borrows.
struct Owned {
    tool: Arc<CatalogTool>,
    server_description: String,
    schema: Value,
}

impl Owned {
    fn new(view: &CatalogView, tool: &Arc<CatalogTool>) -> Owned {
        Owned {
            tool: Arc::clone(tool),
            server_description: view
                .server(&tool.server)
                .map(|s| s.description.clone())
                .unwrap_or_default(),
            schema: Value::Object((*tool.definition.input_schema).clone()),
        }
    }

    fn as_export(&self) -> ExportTool<'_> {
        ExportTool {
            qualified: &self.tool.qualified,
            server: &self.tool.server,
            server_description: &self.server_description,
            tool: &self.tool.name,
            description: self.tool.description(),
            input_schema: &self.schema,
        }
    }
}

/// The visible tools in first-seen order. One statement beyond the listing.
async fn ordered(state: &GatewayState, visible: &Visible) -> Result<Vec<Owned>, ExportError> {
    let first_seen: HashMap<(String, String), i64> = state
        .governance()
        .store()
        .list_tool_classifications()
        .await?
        .into_iter()
        .map(|c| ((c.server, c.tool), c.first_seen_at))
        .collect();
    let mut tools: Vec<(i64, Owned)> = visible
        .view
        .tools()
        .map(|t| {
            let seen = first_seen
                .get(&(t.server.clone(), t.upstream_name.clone()))
                .copied()
                .unwrap_or(i64::MAX);
            (seen, Owned::new(&visible.view, t))
        })
        .collect();
    tools.sort_by(|(a, x), (b, y)| {
        (a, &x.tool.server, &x.tool.upstream_name).cmp(&(b, &y.tool.server, &y.tool.upstream_name))
    });
    Ok(tools.into_iter().map(|(_, t)| t).collect())
}

/// The caller's visible catalog as a `tools` array for `provider`.
pub async fn export(
    state: &GatewayState,
    caller: &Caller,
    provider: Provider,
) -> Result<Export, ExportError> {
    export_with(state, caller, provider, &state.config.export).await
}

/// [`export`] with other export settings.
pub async fn export_with(
    state: &GatewayState,
    caller: &Caller,
    provider: Provider,
    config: &manifold_export::ExportConfig,
) -> Result<Export, ExportError> {
    let visible = state.visible(caller, Some("export")).await?;
    let tools = ordered(state, &visible).await?;
    let tools: Vec<ExportTool<'_>> = tools.iter().map(Owned::as_export).collect();
    Ok(manifold_export::export(provider, &tools, config))
}

/// One provider-shaped search.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSearch {
    pub query: String,
    pub limit: Option<usize>,
    pub server: Option<String>,
    pub strategy: Option<Strategy>,
    pub format: SearchFormat,
    /// The `tool_use_id` (Anthropic) or `call_id` (OpenAI) of the model's
    /// search call, copied into the answer.
    pub call_id: Option<String>,
}

/// Manifold's ranked search over the caller's visible tools, answered as
/// the provider's client-side search result.
pub async fn search(
    state: &GatewayState,
    caller: &Caller,
    request: &ProviderSearch,
) -> Result<Value, ExportError> {
    let visible = state.visible(caller, None).await?;
    let limit = request
        .limit
        .unwrap_or(state.config.default_limit)
        .clamp(1, state.config.max_limit);
    let strategy = request.strategy.unwrap_or(state.config.strategy);
    let index = state.discovery.index(&visible.view);
    let server = request.server.as_deref();
    let filter = |doc: &ToolDoc| server.is_none_or(|s| doc.server == s);
    let hits = index.query(strategy, &request.query, limit, &filter)?;
    let tools: Vec<Owned> = hits
        .iter()
        .filter_map(|hit| visible.view.tool(&hit.id))
        .map(|t| Owned::new(&visible.view, t))
        .collect();
    let names: Vec<&str> = tools.iter().map(|t| t.tool.qualified.as_str()).collect();
    state.governance().record_search(caller, &names).await;
    let hits: Vec<ExportTool<'_>> = tools.iter().map(Owned::as_export).collect();
    Ok(manifold_export::search_result(
        request.format.provider(),
        &hits,
        request.call_id.as_deref(),
    ))
}

/// The qualified name a provider-facing name stands for in `view`: a
/// qualified name, an Anthropic tool name, or an OpenAI function with its
/// namespace (or `namespace.function`). Resolution uses the caller's whole
/// view; the broker still decides whether the call may go ahead.
pub fn resolve(view: &CatalogView, name: &str, namespace: Option<&str>) -> Option<String> {
    // The common case, a qualified name, is one lookup; only a provider's
    // rewritten name needs the names recomputed over the view.
    if namespace.is_none()
        && let Some(tool) = view.tool(name)
    {
        return Some(tool.qualified.clone());
    }
    let tools: Vec<NamedTool<'_>> = view
        .tools()
        .map(|t| NamedTool {
            qualified: &t.qualified,
            server: &t.server,
            tool: &t.name,
        })
        .collect();
    manifold_export::resolve(tools.iter().copied(), name, namespace).map(str::to_string)
}
