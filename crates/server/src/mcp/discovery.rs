use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
};

use manifold_broker::Visible;
use manifold_catalog::{CatalogTool, CatalogView, one_line};
use manifold_search::{
    Bm25Cache, Bm25Params, Embedder, Reranker, SearchError, SearchIndex, Strategy, ToolDoc,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// How much of each tool `search_tools` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Detail {
    Name,
    #[default]
    Summary,
    Full,
    /// Names, plus TypeScript declarations of the hits for code mode.
    Typescript,
}

/// Unknown names longer than this get no "did you mean" suggestions.
pub const MAX_SUGGESTED_NAME_BYTES: usize = 128;

/// Search indexes, one per catalog view. A view's key changes whenever any
/// listing in it changes, so a changed catalog is re-indexed on next use.
///
/// With an embedder ([`Discovery::new`]), each index also holds tool
/// vectors, which enables the `embedding` and `hybrid` strategies. Without
/// one (or when embedding a catalog fails, which is logged), `hybrid` is
/// BM25F and `embedding` is refused with a clear error.
#[derive(Default)]
pub struct Discovery {
    indexes: Mutex<HashMap<u64, Arc<SearchIndex>>>,
    /// What the next build reuses: every tool's analysis, and the newest
    /// index (for its unchanged tools' vectors). After one server changes,
    /// only its tools are analysed and embedded.
    rebuild: Mutex<Rebuild>,
    embedder: Option<Arc<dyn Embedder>>,
    reranker: Option<Arc<dyn Reranker>>,
}

#[derive(Default)]
struct Rebuild {
    bm25: Bm25Cache,
    last: Option<Arc<SearchIndex>>,
}

/// Views are few (one per distinct set of private listings); keep a handful.
const MAX_INDEXES: usize = 64;

impl Discovery {
    /// Search with the model that embeds tools and queries, and the `rerank`
    /// strategy's model, where loaded.
    pub fn new(embedder: Option<Arc<dyn Embedder>>, reranker: Option<Arc<dyn Reranker>>) -> Self {
        Discovery {
            embedder,
            reranker,
            ..Discovery::default()
        }
    }

    /// Whether a search may block on a model (an embedder or a reranker).
    pub fn may_block(&self) -> bool {
        self.embedder.is_some() || self.reranker.is_some()
    }

    /// Whether an embedder is attached.
    pub fn has_embedder(&self) -> bool {
        self.embedder.is_some()
    }

    /// The index of `view`, built on first use. With an embedder this embeds
    /// the tools whose text the embedder has not seen (blocking).
    pub fn index(&self, view: &CatalogView) -> Arc<SearchIndex> {
        if let Some(index) = self.indexes.lock().expect("index lock").get(&view.key) {
            manifold_catalog::cache_lookup("search_index", true);
            return Arc::clone(index);
        }
        manifold_catalog::cache_lookup("search_index", false);
        let docs = view.tools().map(|t| tool_doc(view, t)).collect();
        // Held while building: builds are rare, and each one updates the
        // cache and the newest index that the next one starts from.
        let mut rebuild = self.rebuild.lock().expect("rebuild lock");
        let mut index = SearchIndex::build_cached(docs, &Bm25Params::default(), &mut rebuild.bm25);
        if let Some(embedder) = &self.embedder
            && let Err(e) = index.embed(Arc::clone(embedder), rebuild.last.as_deref())
        {
            tracing::warn!(
                error = %e,
                tools = index.len(),
                "search: the catalog could not be embedded; the embedding strategy is \
                 unavailable and hybrid searches with bm25 until the catalog changes"
            );
        }
        if let Some(reranker) = &self.reranker {
            index = index.with_reranker(Arc::clone(reranker));
        }
        let index = Arc::new(index);
        rebuild.last = Some(Arc::clone(&index));
        drop(rebuild);
        let mut indexes = self.indexes.lock().expect("index lock");
        if indexes.len() >= MAX_INDEXES {
            indexes.clear();
        }
        indexes.insert(view.key, Arc::clone(&index));
        index
    }

    /// Run a search and shape the result grouped by server, best server first.
    pub fn search(
        &self,
        visible: &Visible,
        query: &str,
        strategy: Strategy,
        limit: usize,
        server: Option<&str>,
        detail: Detail,
    ) -> Result<SearchOutcome, SearchError> {
        let view = &visible.view;
        let index = self.index(view);
        let filter = |doc: &ToolDoc| server.is_none_or(|s| doc.server == s);
        // What really ran: hybrid without vectors is BM25F, a failed rerank
        // is hybrid.
        let (strategy, hits) = index.run(strategy, query, limit, &filter)?;
        let typescript = (detail == Detail::Typescript).then(|| {
            let tools: Vec<&CatalogTool> = hits
                .iter()
                .filter_map(|hit| view.tool(&hit.id).map(|t| t.as_ref()))
                .collect();
            typescript(&tools, &script_bindings(view))
        });
        let mut groups: Vec<(String, Vec<Value>)> = Vec::new();
        let mut positions: BTreeMap<String, usize> = BTreeMap::new();
        for hit in &hits {
            let Some(tool) = view.tool(&hit.id) else {
                continue;
            };
            let entry = render_tool(
                tool,
                detail,
                visible.needs_approval.contains(&tool.qualified),
            );
            match positions.get(&tool.server) {
                Some(&i) => groups[i].1.push(entry),
                None => {
                    positions.insert(tool.server.clone(), groups.len());
                    groups.push((tool.server.clone(), vec![entry]));
                }
            }
        }
        let servers = groups
            .into_iter()
            .map(|(name, tools)| {
                let sv = view.server(&name);
                let mut group = json!({
                    "server": name,
                    "description": sv.map(|s| s.description.as_str()).unwrap_or(""),
                    "tools": tools,
                });
                if let Some(error) = sv.and_then(|s| s.error.as_deref()) {
                    group["stale"] = json!(true);
                    group["error"] = json!(error);
                }
                group
            })
            .collect();
        Ok(SearchOutcome {
            query: query.to_string(),
            strategy,
            count: hits.len(),
            servers,
            typescript,
        })
    }

    /// Close names for an unknown tool, restricted to what the caller can see.
    /// A name longer than any real one gets none: the fuzzy match's work
    /// grows with the name's length, times the catalog.
    pub fn suggest(&self, view: &CatalogView, name: &str) -> Vec<String> {
        if name.len() > MAX_SUGGESTED_NAME_BYTES {
            return Vec::new();
        }
        self.index(view)
            .suggest(name, 5)
            .into_iter()
            .filter(|id| view.tool(id).is_some())
            .collect()
    }
}

#[derive(Debug, Serialize)]
pub struct SearchOutcome {
    pub query: String,
    pub strategy: Strategy,
    pub count: usize,
    pub servers: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub typescript: Option<String>,
}

impl SearchOutcome {
    /// The qualified names of the hits, for the discovery audit.
    pub fn names(&self) -> Vec<&str> {
        self.servers
            .iter()
            .filter_map(|group| group["tools"].as_array())
            .flatten()
            .filter_map(|tool| tool["name"].as_str())
            .collect()
    }
}

fn tool_doc(view: &CatalogView, tool: &CatalogTool) -> ToolDoc {
    let schema = Value::Object((*tool.definition.input_schema).clone());
    ToolDoc {
        id: tool.qualified.clone(),
        server: tool.server.clone(),
        server_description: view
            .server(&tool.server)
            .map(|s| s.description.clone())
            .unwrap_or_default(),
        name: tool.name.clone(),
        title: tool.definition.title.clone(),
        description: tool.description().to_string(),
        params: ToolDoc::params_from_schema(&schema),
    }
}

fn render_tool(tool: &CatalogTool, detail: Detail, needs_approval: bool) -> Value {
    let mut out = match detail {
        Detail::Name | Detail::Typescript => json!({ "name": tool.qualified }),
        Detail::Summary => json!({
            "name": tool.qualified,
            "description": one_line(tool.description()),
        }),
        Detail::Full => json!({
            "name": tool.qualified,
            "description": tool.description(),
            "inputSchema": Value::Object((*tool.definition.input_schema).clone()),
        }),
    };
    if needs_approval {
        out["requiresApproval"] = json!(true);
    }
    out
}

/// Script names over a whole view (what code mode binds when it has no
/// cache of its own).
pub(crate) fn script_bindings(view: &CatalogView) -> manifold_codemode::Bindings {
    manifold_codemode::Bindings::new(view.tools().map(|t| (t.server.as_str(), t.name.as_str())))
}

/// Code-mode declarations for `tools`: `server.tool(input)` stubs typed from
/// their schemas, named as `bindings` (computed over the whole catalog) say.
pub(crate) fn typescript(tools: &[&CatalogTool], bindings: &manifold_codemode::Bindings) -> String {
    let schemas: Vec<(Value, Option<Value>)> = tools
        .iter()
        .map(|t| {
            (
                Value::Object((*t.definition.input_schema).clone()),
                t.definition
                    .output_schema
                    .as_ref()
                    .map(|s| Value::Object((**s).clone())),
            )
        })
        .collect();
    let stubs: Vec<manifold_codemode::StubTool<'_>> = tools
        .iter()
        .zip(&schemas)
        .map(|(tool, (input, output))| manifold_codemode::StubTool {
            server: &tool.server,
            name: &tool.name,
            description: tool.description(),
            input_schema: input,
            output_schema: output.as_ref(),
        })
        .collect();
    manifold_codemode::declarations_with(&stubs, bindings)
}

/// The full definition for `get_tool_details`.
pub(crate) fn tool_details(tool: &CatalogTool, needs_approval: bool) -> Value {
    let def = &tool.definition;
    let mut out = json!({
        "name": tool.qualified,
        "server": tool.server,
        "description": tool.description(),
        "inputSchema": Value::Object((*def.input_schema).clone()),
        "hash": tool.hash,
    });
    if needs_approval {
        // Each call waits for an operator; the model should say so.
        out["requiresApproval"] = json!(true);
    }
    if let Some(title) = &def.title {
        out["title"] = json!(title);
    }
    if let Some(schema) = &def.output_schema {
        out["outputSchema"] = Value::Object((**schema).clone());
    }
    if let Some(annotations) = &def.annotations {
        // Upstream annotations are hints only; say so where the model reads them.
        out["annotations"] = serde_json::to_value(annotations).unwrap_or(Value::Null);
        out["annotationsTrusted"] = json!(false);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Counts the texts it is asked to embed; vectors from word lengths.
    struct Counting(AtomicUsize);

    impl Embedder for Counting {
        fn model_id(&self) -> &str {
            "counting"
        }

        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, manifold_search::EmbedError> {
            self.0.fetch_add(texts.len(), Ordering::Relaxed);
            Ok(texts
                .iter()
                .map(|t| t.split(' ').map(|w| w.len() as f32 + 1.0).take(4).collect())
                .map(|mut v: Vec<f32>| {
                    v.resize(4, 1.0);
                    v
                })
                .collect())
        }
    }

    fn view(revision: &str) -> CatalogView {
        let tools = |server: &str, extra: &str| -> Vec<rmcp::model::Tool> {
            (0..5)
                .map(|i| {
                    serde_json::from_value(json!({
                        "name": format!("{server}_tool{i}"),
                        "description": format!("Tool {i} of {server}{extra}"),
                        "inputSchema": {"type": "object"}
                    }))
                    .unwrap()
                })
                .collect()
        };
        CatalogView::from_listings(
            vec![
                ("alpha".into(), String::new(), tools("alpha", "")),
                ("beta".into(), String::new(), tools("beta", revision)),
                ("gamma".into(), String::new(), tools("gamma", "")),
            ],
            true,
        )
    }

    #[test]
    fn a_changed_server_is_the_only_one_embedded_again() {
        let model = Arc::new(Counting(AtomicUsize::new(0)));
        let discovery = Discovery::new(Some(model.clone()), None);
        let first = discovery.index(&view(""));
        assert!(first.has_embeddings());
        assert_eq!(model.0.load(Ordering::Relaxed), 15);
        let second = discovery.index(&view(" (revised)"));
        assert_eq!(second.len(), 15);
        assert_eq!(model.0.load(Ordering::Relaxed), 15 + 5, "only beta's tools");
        let again = discovery.index(&view(" (revised)"));
        assert!(
            Arc::ptr_eq(&second, &again),
            "an unchanged view is not rebuilt"
        );
        assert_eq!(model.0.load(Ordering::Relaxed), 20);
        let hits = second
            .query(Strategy::Bm25, "revised", 10, &|_| true)
            .unwrap();
        assert_eq!(hits.len(), 5);
        assert!(hits.iter().all(|h| h.id.starts_with("beta__")), "{hits:?}");
    }
}
