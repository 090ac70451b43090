//! The governed catalog in the deferred-loading shapes of two model APIs.
//!
//! [`export`] turns tools, already filtered for a caller and in the order to
//! keep, into a ready-to-send `tools` array for the Anthropic Messages API or
//! the OpenAI Responses API. [`search_result`] renders search hits as the
//! block or item each API expects back from a client-side search, and
//! [`names::resolve`] maps the names a model calls back to qualified names.
//!
//! The search entry comes first and never changes; tools follow in the order
//! given. A host that keeps the order append-only (Manifold orders by first
//! sighting) keeps the provider's prompt cache across catalog changes.

pub mod names;
pub mod schema;

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

pub use names::{NamedTool, resolve};
pub use schema::SchemaChange;

/// A model API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    Anthropic,
    #[serde(rename = "openai")]
    OpenAi,
}

impl std::str::FromStr for Provider {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "anthropic" => Ok(Provider::Anthropic),
            "openai" => Ok(Provider::OpenAi),
            other => Err(format!(
                "unknown format '{other}' (expected anthropic or openai)"
            )),
        }
    }
}

/// Which search the Anthropic export offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AnthropicSearch {
    /// The server-side `tool_search_tool_bm25_20251119`.
    #[default]
    Bm25,
    /// The server-side `tool_search_tool_regex_20251119`.
    Regex,
    /// A custom tool the host answers with Manifold's search
    /// (`format: "anthropic_tool_reference"`).
    Manifold,
}

/// Which search the OpenAI export offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpenAiSearch {
    /// `{"type": "tool_search"}`, run by OpenAI.
    #[default]
    Hosted,
    /// `tool_search` with `execution: "client"`, answered with Manifold's
    /// search (`format: "openai_tool_search_output"`).
    Manifold,
}

/// Export settings (`[export]` in the config).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExportConfig {
    /// Qualified names sent with their schema up front (never deferred).
    pub hot_tools: Vec<String>,
    pub anthropic_search: AnthropicSearch,
    pub openai_search: OpenAiSearch,
}

/// One tool to export.
#[derive(Debug, Clone, Copy)]
pub struct ExportTool<'a> {
    /// `server__tool`, what the broker knows it by.
    pub qualified: &'a str,
    pub server: &'a str,
    pub server_description: &'a str,
    /// The tool's name on its server.
    pub tool: &'a str,
    pub description: &'a str,
    pub input_schema: &'a Value,
}

impl<'a> ExportTool<'a> {
    pub fn named(&self) -> NamedTool<'a> {
        NamedTool {
            qualified: self.qualified,
            server: self.server,
            tool: self.tool,
        }
    }
}

/// How one tool is named for the provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NameEntry {
    pub qualified: String,
    /// The Anthropic tool name, or the OpenAI function name.
    pub name: String,
    /// The OpenAI namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// An exported catalog.
#[derive(Debug, Clone, Serialize)]
pub struct Export {
    pub format: Provider,
    /// The `tools` array to send.
    pub tools: Vec<Value>,
    /// Provider names back to qualified names, in export order.
    pub names: Vec<NameEntry>,
    /// What was changed in input schemas for this API.
    pub schema_changes: Vec<SchemaChange>,
}

/// Name of the custom search tool in the Anthropic `manifold` search kind.
pub const ANTHROPIC_SEARCH_TOOL: &str = "manifold_search_tools";

const SEARCH_DESCRIPTION: &str = "Search the available tools by what they do. Returns the \
     matching tools, ranked, so that they can be called.";

fn search_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What the tool should do, in words."},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50, "description": "Most tools to load (default 5)."}
        },
        "required": ["query"],
        "additionalProperties": false
    })
}

/// The search entry of the `tools` array.
pub fn search_entry(provider: Provider, config: &ExportConfig) -> Value {
    match provider {
        Provider::Anthropic => match config.anthropic_search {
            AnthropicSearch::Bm25 => {
                json!({"type": "tool_search_tool_bm25_20251119", "name": "tool_search_tool_bm25"})
            }
            AnthropicSearch::Regex => {
                json!({"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"})
            }
            AnthropicSearch::Manifold => json!({
                "name": ANTHROPIC_SEARCH_TOOL,
                "description": SEARCH_DESCRIPTION,
                "input_schema": search_parameters(),
            }),
        },
        Provider::OpenAi => match config.openai_search {
            OpenAiSearch::Hosted => json!({"type": "tool_search"}),
            OpenAiSearch::Manifold => json!({
                "type": "tool_search",
                "execution": "client",
                "description": SEARCH_DESCRIPTION,
                "parameters": search_parameters(),
            }),
        },
    }
}

/// The `tools` array for `provider`: the search entry, then `tools` in the
/// order given (for OpenAI, one namespace per server, in the order of each
/// server's first tool).
pub fn export(provider: Provider, tools: &[ExportTool<'_>], config: &ExportConfig) -> Export {
    let hot: BTreeSet<&str> = config.hot_tools.iter().map(String::as_str).collect();
    let mut out = Export {
        format: provider,
        tools: vec![search_entry(provider, config)],
        names: Vec::with_capacity(tools.len()),
        schema_changes: Vec::new(),
    };
    match provider {
        Provider::Anthropic => {
            for tool in tools {
                let (definition, changes) = anthropic_tool(tool, !hot.contains(tool.qualified));
                out.schema_changes.extend(changes);
                out.names.push(NameEntry {
                    qualified: tool.qualified.to_string(),
                    name: definition["name"].as_str().unwrap_or_default().to_string(),
                    namespace: None,
                });
                out.tools.push(definition);
            }
        }
        Provider::OpenAi => {
            let mut namespaces: Vec<(String, Value)> = Vec::new();
            for tool in tools {
                let (function, changes) = openai_function(tool, !hot.contains(tool.qualified));
                out.schema_changes.extend(changes);
                let namespace = names::openai_namespace(tool.server);
                out.names.push(NameEntry {
                    qualified: tool.qualified.to_string(),
                    name: function["name"].as_str().unwrap_or_default().to_string(),
                    namespace: Some(namespace.clone()),
                });
                match namespaces.iter_mut().find(|(name, _)| *name == namespace) {
                    Some((_, ns)) => ns["tools"]
                        .as_array_mut()
                        .expect("namespaces hold an array")
                        .push(function),
                    None => {
                        let ns = namespace_object(&namespace, tool, vec![function]);
                        namespaces.push((namespace, ns));
                    }
                }
            }
            out.tools.extend(namespaces.into_iter().map(|(_, ns)| ns));
        }
    }
    out
}

fn namespace_object(name: &str, tool: &ExportTool<'_>, functions: Vec<Value>) -> Value {
    let description = if tool.server_description.trim().is_empty() {
        format!("Tools of the {} server.", tool.server)
    } else {
        tool.server_description.to_string()
    };
    json!({
        "type": "namespace",
        "name": name,
        "description": description,
        "tools": functions,
    })
}

/// One Anthropic tool definition.
fn anthropic_tool(tool: &ExportTool<'_>, deferred: bool) -> (Value, Vec<SchemaChange>) {
    let (input_schema, changes) =
        schema::adapt(Provider::Anthropic, tool.qualified, tool.input_schema);
    let mut definition = Map::new();
    definition.insert("name".into(), json!(names::anthropic_name(tool.qualified)));
    definition.insert("description".into(), json!(tool.description));
    definition.insert("input_schema".into(), input_schema);
    if deferred {
        definition.insert("defer_loading".into(), json!(true));
    }
    (Value::Object(definition), changes)
}

/// One OpenAI function tool, named within its server's namespace.
fn openai_function(tool: &ExportTool<'_>, deferred: bool) -> (Value, Vec<SchemaChange>) {
    let (parameters, changes) = schema::adapt(Provider::OpenAi, tool.qualified, tool.input_schema);
    let mut function = Map::new();
    function.insert("type".into(), json!("function"));
    function.insert("name".into(), json!(names::openai_function(tool.tool)));
    function.insert("description".into(), json!(tool.description));
    function.insert("parameters".into(), parameters);
    if deferred {
        function.insert("defer_loading".into(), json!(true));
    }
    (Value::Object(function), changes)
}

/// What the model sees of `tools` before any search: entries without
/// `defer_loading`, and of each namespace its name, description and
/// non-deferred functions. Deferred definitions stay out of the context
/// until a search loads them.
pub fn upfront(tools: &[Value]) -> Vec<Value> {
    tools
        .iter()
        .filter(|t| t.get("defer_loading") != Some(&Value::Bool(true)))
        .map(|t| {
            if t["type"] != "namespace" {
                return t.clone();
            }
            let mut ns = t.clone();
            if let Some(functions) = ns["tools"].as_array_mut() {
                functions.retain(|f| f.get("defer_loading") != Some(&Value::Bool(true)));
            }
            ns
        })
        .collect()
}

/// Search hits as a client-side search answers them.
///
/// - Anthropic: a `tool_result` block whose content is one `tool_reference`
///   per hit (`call_id` is the `tool_use_id` of the search call);
/// - OpenAI: a `tool_search_output` item (`execution: "client"`) whose
///   `tools` are the hits' namespaces holding the loaded functions.
pub fn search_result(provider: Provider, hits: &[ExportTool<'_>], call_id: Option<&str>) -> Value {
    match provider {
        Provider::Anthropic => {
            let references: Vec<Value> = hits
                .iter()
                .map(|t| json!({"type": "tool_reference", "tool_name": names::anthropic_name(t.qualified)}))
                .collect();
            let mut block = json!({"type": "tool_result", "content": references});
            if let Some(id) = call_id {
                block["tool_use_id"] = json!(id);
            }
            block
        }
        Provider::OpenAi => {
            let mut namespaces: Vec<(String, Value)> = Vec::new();
            for tool in hits {
                let (function, _) = openai_function(tool, false);
                let namespace = names::openai_namespace(tool.server);
                match namespaces.iter_mut().find(|(name, _)| *name == namespace) {
                    Some((_, ns)) => ns["tools"]
                        .as_array_mut()
                        .expect("namespaces hold an array")
                        .push(function),
                    None => {
                        let ns = namespace_object(&namespace, tool, vec![function]);
                        namespaces.push((namespace, ns));
                    }
                }
            }
            json!({
                "type": "tool_search_output",
                "call_id": call_id,
                "execution": "client",
                "status": "completed",
                "tools": namespaces.into_iter().map(|(_, ns)| ns).collect::<Vec<_>>(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(schema: &Value) -> Vec<ExportTool<'_>> {
        vec![
            ExportTool {
                qualified: "gh__create_issue",
                server: "gh",
                server_description: "GitHub",
                tool: "create_issue",
                description: "Create an issue.",
                input_schema: schema,
            },
            ExportTool {
                qualified: "time__now",
                server: "time",
                server_description: "",
                tool: "now",
                description: "The time.",
                input_schema: schema,
            },
            ExportTool {
                qualified: "gh__list_issues",
                server: "gh",
                server_description: "GitHub",
                tool: "list_issues",
                description: "List issues.",
                input_schema: schema,
            },
        ]
    }

    #[test]
    fn anthropic_defers_all_but_hot_tools() {
        let schema = json!({"type": "object", "properties": {}});
        let config = ExportConfig {
            hot_tools: vec!["time__now".into()],
            ..Default::default()
        };
        let out = export(Provider::Anthropic, &tools(&schema), &config);
        assert_eq!(out.tools[0]["type"], "tool_search_tool_bm25_20251119");
        assert_eq!(out.tools[1]["name"], "gh__create_issue");
        assert_eq!(out.tools[1]["defer_loading"], true);
        assert!(out.tools[2].get("defer_loading").is_none());
    }

    #[test]
    fn openai_groups_by_server_in_first_seen_order() {
        let schema = json!({"type": "object", "properties": {}});
        let out = export(Provider::OpenAi, &tools(&schema), &ExportConfig::default());
        assert_eq!(out.tools[0], json!({"type": "tool_search"}));
        assert_eq!(out.tools[1]["name"], "gh");
        assert_eq!(out.tools[1]["tools"][1]["name"], "list_issues");
        assert_eq!(out.tools[2]["name"], "time");
        assert_eq!(out.tools[2]["description"], "Tools of the time server.");
        assert_eq!(out.names[2].namespace.as_deref(), Some("gh"));
    }

    #[test]
    fn search_results_have_each_api_shape() {
        let schema = json!({"type": "object", "properties": {}});
        let hits = tools(&schema);
        let block = search_result(Provider::Anthropic, &hits[..1], Some("toolu_1"));
        assert_eq!(
            block,
            json!({"type": "tool_result", "content": [{"type": "tool_reference", "tool_name": "gh__create_issue"}], "tool_use_id": "toolu_1"})
        );
        let item = search_result(Provider::OpenAi, &hits, Some("call_1"));
        assert_eq!(item["tools"][0]["tools"][1]["name"], "list_issues");
        assert!(item["tools"][0]["tools"][0].get("defer_loading").is_none());
    }
}
