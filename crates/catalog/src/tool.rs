//! One upstream tool as callers see it, and the operator's overrides
//! (`[[servers.tools]]`) that shape it: a rename, a description, or hidden.

use std::{sync::OnceLock, time::Duration};

use manifold_upstream::ToolOverride;
use rmcp::model::Tool;
use sha2::{Digest, Sha256};

use crate::{count_tokens, qualify};

/// One upstream tool as the gateway knows it.
#[derive(Debug)]
pub struct CatalogTool {
    /// What the model sees: `server__tool` (or the bare name when unqualified).
    pub qualified: String,
    pub server: String,
    /// The upstream's own name: what a call is forwarded as, and the tool's
    /// identity for classification, quarantine and audit.
    pub upstream_name: String,
    /// The bare name callers see: the operator's rename, else the upstream's.
    pub name: String,
    /// When the operator renamed the tool: its qualified name under the
    /// upstream's name, which token scopes match as well.
    pub upstream_qualified: Option<String>,
    /// The definition as callers see it: the upstream's, under [`Self::name`]
    /// and with the operator's description if it set one.
    pub definition: Tool,
    /// SHA-256 of the definition as the upstream sent it (an override does
    /// not change it); changes when the upstream's tool does.
    pub hash: String,
    tokens: OnceLock<usize>,
    call_metrics: OnceLock<CallMetrics>,
}

/// One tool's call metrics, each registered when first used. Looking a
/// labelled metric up by name on every call cloned and hashed its labels
/// each time.
#[derive(Debug, Default)]
struct CallMetrics {
    /// `manifold_tool_calls_total`, one per [`CallEnd`].
    calls: [OnceLock<metrics::Counter>; CallEnd::ALL.len()],
    duration: OnceLock<metrics::Histogram>,
}

/// How a forwarded call ended, as `manifold_tool_calls_total` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallEnd {
    Ok,
    ToolError,
    Cancelled,
    UpstreamError,
}

impl CallEnd {
    const ALL: [CallEnd; 4] = [
        CallEnd::Ok,
        CallEnd::ToolError,
        CallEnd::Cancelled,
        CallEnd::UpstreamError,
    ];

    pub fn label(self) -> &'static str {
        match self {
            CallEnd::Ok => "ok",
            CallEnd::ToolError => "tool_error",
            CallEnd::Cancelled => "cancelled",
            CallEnd::UpstreamError => "upstream_error",
        }
    }
}

impl CatalogTool {
    pub(crate) fn new(server: &str, definition: Tool, qualify_names: bool) -> Self {
        Self::shaped(server, definition, None, qualify_names)
    }

    /// The tool as `shape` (an operator's override) says callers see it.
    fn shaped(
        server: &str,
        mut definition: Tool,
        shape: Option<&ToolOverride>,
        qualify_names: bool,
    ) -> Self {
        let canonical = serde_json::to_vec(&definition).expect("tools serialize");
        let upstream_name = definition.name.to_string();
        let name = shape
            .and_then(|o| o.rename.clone())
            .unwrap_or_else(|| upstream_name.clone());
        if let Some(description) = shape.and_then(|o| o.description.clone()) {
            definition.description = Some(description.into());
        }
        let exposed = |bare: &str| match qualify_names {
            true => qualify(server, bare),
            false => bare.to_string(),
        };
        let upstream_qualified = (name != upstream_name).then(|| exposed(&upstream_name));
        definition.name = name.clone().into();
        Self {
            hash: hex::encode(Sha256::digest(&canonical)),
            qualified: exposed(&name),
            server: server.to_string(),
            upstream_name,
            name,
            upstream_qualified,
            definition,
            tokens: OnceLock::new(),
            call_metrics: OnceLock::new(),
        }
    }

    /// The operator's name for the tool, when it differs from the
    /// upstream's.
    pub fn renamed(&self) -> Option<&str> {
        self.upstream_qualified.as_ref().map(|_| self.name.as_str())
    }

    /// The definition under its qualified name, as exposed downstream.
    pub fn exposed(&self) -> Tool {
        let mut tool = self.definition.clone();
        tool.name = self.qualified.clone().into();
        tool
    }

    pub fn description(&self) -> &str {
        self.definition.description.as_deref().unwrap_or("")
    }

    /// Counts one forwarded call that ended as `outcome` and records how
    /// long it took. Server and tool labels come from the catalog, never
    /// from the request, so the label set stays as small as the configured
    /// catalog.
    pub fn record_call(&self, outcome: CallEnd, elapsed: Duration) {
        let metrics = self.call_metrics.get_or_init(CallMetrics::default);
        metrics.calls[outcome as usize]
            .get_or_init(|| {
                metrics::counter!(
                    "manifold_tool_calls_total",
                    "server" => self.server.clone(),
                    "tool" => self.upstream_name.clone(),
                    "outcome" => outcome.label()
                )
            })
            .increment(1);
        metrics
            .duration
            .get_or_init(|| {
                metrics::histogram!(
                    "manifold_tool_call_duration_seconds",
                    "server" => self.server.clone(),
                    "tool" => self.upstream_name.clone()
                )
            })
            .record(elapsed.as_secs_f64());
    }

    /// Tokens of the exposed definition's JSON.
    pub fn tokens(&self) -> usize {
        *self.tokens.get_or_init(|| {
            count_tokens(&serde_json::to_string(&self.exposed()).expect("tools serialize"))
        })
    }
}

/// One server's listing shaped by its overrides.
pub(crate) struct Shaped {
    pub tools: Vec<CatalogTool>,
    /// Overrides naming a tool the listing does not have, and renames that
    /// would take a name another tool of the server has (not applied).
    pub unmatched: Vec<String>,
}

/// Applies `overrides` to `server`'s listing: hidden tools leave it before
/// anything (search, code mode, a call) can see them, and renamed or
/// re-described ones are shown as the operator says.
pub(crate) fn shape_listing(
    server: &str,
    listing: Vec<Tool>,
    overrides: &[ToolOverride],
    qualify_names: bool,
) -> Shaped {
    if overrides.is_empty() {
        // Most servers: nothing to look up per tool.
        let tools = listing
            .into_iter()
            .map(|t| CatalogTool::new(server, t, qualify_names))
            .collect();
        return Shaped {
            tools,
            unmatched: Vec::new(),
        };
    }
    let mut unmatched: Vec<String> = overrides
        .iter()
        .filter(|o| !listing.iter().any(|t| t.name == o.name))
        .map(|o| format!("'{}' names no tool of this server", o.name))
        .collect();
    // A rename onto a name another shown tool keeps would make two tools
    // one: such a rename is not applied.
    let kept: Vec<String> = listing
        .iter()
        .map(|t| t.name.to_string())
        .filter(|n| {
            !overrides
                .iter()
                .any(|o| o.name == **n && (o.rename.is_some() || o.hidden))
        })
        .collect();
    let mut tools = Vec::with_capacity(listing.len());
    for definition in listing {
        let shape = overrides.iter().find(|o| o.name == definition.name);
        if shape.is_some_and(|o| o.hidden) {
            continue;
        }
        let shape = match shape {
            Some(o) if o.rename.as_ref().is_some_and(|r| kept.contains(r)) => {
                unmatched.push(format!(
                    "'{}' is not renamed to '{}': another tool of this server has that name",
                    o.name,
                    o.rename.as_deref().unwrap_or_default()
                ));
                None
            }
            shape => shape,
        };
        tools.push(CatalogTool::shaped(
            server,
            definition,
            shape,
            qualify_names,
        ));
    }
    Shaped { tools, unmatched }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn tool(name: &str, description: &str) -> Tool {
        Tool::new(
            name.to_string(),
            description.to_string(),
            Arc::new(serde_json::Map::new()),
        )
    }

    fn shape(name: &str, rename: Option<&str>, description: Option<&str>) -> ToolOverride {
        ToolOverride {
            name: name.into(),
            rename: rename.map(Into::into),
            description: description.map(Into::into),
            hidden: false,
        }
    }

    #[test]
    fn an_override_renames_redescribes_or_hides_and_keeps_the_upstream_identity() {
        let listing = vec![
            tool("read", "Reads."),
            tool("delete", "Deletes."),
            tool("list", "Lists."),
        ];
        let plain: Vec<_> = listing
            .iter()
            .map(|t| CatalogTool::new("files", t.clone(), true))
            .collect();
        let overrides = [
            shape("read", Some("read_file"), Some("Reads one file by path.")),
            ToolOverride {
                hidden: true,
                ..shape("delete", None, None)
            },
            shape("gone", Some("x"), None),
        ];
        let shaped = shape_listing("files", listing, &overrides, true);
        let names: Vec<_> = shaped.tools.iter().map(|t| t.qualified.as_str()).collect();
        assert_eq!(names, ["files__read_file", "files__list"]);
        let read = &shaped.tools[0];
        assert_eq!(read.upstream_name, "read");
        assert_eq!(read.name, "read_file");
        assert_eq!(read.renamed(), Some("read_file"));
        assert_eq!(read.upstream_qualified.as_deref(), Some("files__read"));
        assert_eq!(read.description(), "Reads one file by path.");
        assert_eq!(read.exposed().name, "files__read_file");
        assert_eq!(
            read.hash, plain[0].hash,
            "an override keeps the tool's hash"
        );
        assert_eq!(shaped.tools[1].renamed(), None);
        assert_eq!(shaped.tools[1].upstream_qualified, None);
        assert_eq!(shaped.unmatched, ["'gone' names no tool of this server"]);
    }

    #[test]
    fn a_rename_onto_another_tools_name_is_not_applied_and_said() {
        let listing = vec![tool("read", "Reads."), tool("get", "Gets.")];
        let overrides = [
            shape("read", Some("get"), None),
            shape("get", Some("fetch"), None),
        ];
        // `get` moves away, so `read` may take its name.
        let shaped = shape_listing("files", listing.clone(), &overrides, false);
        let names: Vec<_> = shaped.tools.iter().map(|t| t.qualified.as_str()).collect();
        assert_eq!(names, ["get", "fetch"]);
        assert!(shaped.unmatched.is_empty());
        let shaped = shape_listing("files", listing, &overrides[..1], false);
        let names: Vec<_> = shaped.tools.iter().map(|t| t.qualified.as_str()).collect();
        assert_eq!(names, ["read", "get"]);
        assert_eq!(
            shaped.unmatched,
            ["'read' is not renamed to 'get': another tool of this server has that name"]
        );
    }
}
