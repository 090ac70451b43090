//! Tool retrieval over the catalog: BM25F, regex, embedding and hybrid
//! strategies.
//!
//! A [`SearchIndex`] is built once from a snapshot of the catalog (a list of
//! [`ToolDoc`]s) and is then read-only: rebuild it when the catalog changes
//! (building 5,600 tools takes a few milliseconds). It answers these questions:
//!
//! - [`SearchIndex::search`]: which tools fit a free-text need (BM25F),
//! - [`SearchIndex::search_regex`]: which tools' names or descriptions match a
//!   pattern,
//! - [`SearchIndex::search_embedding`] and [`SearchIndex::search_hybrid`]:
//!   the same need by meaning (cosine similarity of sentence vectors), alone
//!   or fused with BM25F; they need vectors attached with
//!   [`SearchIndex::with_embeddings`] and an [`Embedder`] (see
//!   `manifold-embed`),
//! - [`SearchIndex::suggest`]: which tools the caller probably meant when it
//!   named one that does not exist.
//!
//! Both searches take a `filter` that decides which tools the caller may see.
//! It is applied while ranking, so a hidden tool is never returned and never
//! takes the place of a visible one: the `limit` is filled from visible tools.
//! Results are deterministic: score descending, then id ascending.
//!
//! This crate knows nothing about upstreams, policies or MCP: callers turn
//! their tools into [`ToolDoc`]s and their policy into a filter.

mod bm25;
pub mod clauses;
mod embed;
pub mod eval;
mod hybrid;
mod regex;
mod rerank;
mod suggest;
mod tokenize;

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use bm25::{Bm25Cache, Bm25Params, FieldParams};
pub use embed::{EmbedError, Embedder, embedding_text};
pub use hybrid::{Fusion, HybridParams};
pub use regex::{MAX_COMPILED_SIZE, MAX_PATTERN_LEN};
pub use rerank::Reranker;
pub use suggest::MAX_SUGGESTED_NAME_BYTES;
pub use tokenize::{analyze, split_identifier, stem};

/// One searchable tool.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ToolDoc {
    /// Qualified name, unique in the index (`server__tool` in Manifold).
    pub id: String,
    /// Name of the server that provides the tool.
    pub server: String,
    /// What the server is for; may be empty.
    pub server_description: String,
    /// The tool's name as the server gives it.
    pub name: String,
    /// Human-readable title, if the server gives one.
    pub title: Option<String>,
    /// The tool's description.
    pub description: String,
    /// Parameter names with their descriptions (empty when undescribed).
    pub params: Vec<(String, String)>,
}

impl ToolDoc {
    /// The `(name, description)` pairs of a JSON Schema's top-level
    /// `properties`, in schema order. Anything else yields no parameters.
    pub fn params_from_schema(schema: &serde_json::Value) -> Vec<(String, String)> {
        let Some(props) = schema.get("properties").and_then(|p| p.as_object()) else {
            return Vec::new();
        };
        props
            .iter()
            .map(|(name, prop)| {
                let text = ["description", "title"]
                    .iter()
                    .find_map(|k| prop.get(*k).and_then(|v| v.as_str()))
                    .unwrap_or_default();
                (name.clone(), text.to_string())
            })
            .collect()
    }
}

/// How `search_tools` interprets its query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Ranked keyword search ([`SearchIndex::search`]).
    Bm25,
    /// Regular expression over names and descriptions ([`SearchIndex::search_regex`]).
    Regex,
    /// Cosine similarity of sentence vectors ([`SearchIndex::search_embedding`]).
    Embedding,
    /// BM25F and embedding rankings fused ([`SearchIndex::search_hybrid`]).
    /// The default: it ranks better than BM25F alone on every dev set, and is
    /// exactly BM25F on an index without vectors.
    #[default]
    Hybrid,
    /// `hybrid`, then a [`Reranker`] re-orders its best tools
    /// ([`SearchIndex::with_reranker`]); `hybrid` when the reranker fails.
    Rerank,
}

impl Strategy {
    /// Every strategy, in the order they are documented.
    pub const ALL: [Strategy; 5] = [
        Self::Bm25,
        Self::Regex,
        Self::Embedding,
        Self::Hybrid,
        Self::Rerank,
    ];
}

impl FromStr for Strategy {
    type Err = SearchError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "bm25" => Ok(Self::Bm25),
            "regex" => Ok(Self::Regex),
            "embedding" => Ok(Self::Embedding),
            "hybrid" => Ok(Self::Hybrid),
            "rerank" => Ok(Self::Rerank),
            _ => Err(SearchError::UnknownStrategy(s.to_string())),
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Bm25 => "bm25",
            Self::Regex => "regex",
            Self::Embedding => "embedding",
            Self::Hybrid => "hybrid",
            Self::Rerank => "rerank",
        })
    }
}

/// One result: a tool id and how well it matched (higher is better; scores
/// compare only within one query and strategy).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hit {
    pub id: String,
    pub score: f32,
}

/// Why a search could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SearchError {
    #[error(
        "regex pattern is {len} characters long; the limit is {max}: use a shorter pattern or the bm25 strategy"
    )]
    PatternTooLong { len: usize, max: usize },
    #[error(
        "regex pattern is too complex: it compiles to more than {limit} bytes; use fewer or smaller repetitions (e.g. `\\w{{1000}}`) or narrower classes"
    )]
    PatternTooComplex { limit: usize },
    #[error("invalid regex pattern: {0}")]
    InvalidPattern(String),
    #[error(
        "unknown search strategy {0:?}: expected \"bm25\", \"regex\", \"embedding\", \"hybrid\" or \"rerank\""
    )]
    UnknownStrategy(String),
    #[error(
        "the embedding strategy is not available here (no embedding model is configured): use bm25 or hybrid"
    )]
    NoEmbeddings,
    #[error("the query could not be embedded: {0}; the bm25 strategy still works")]
    Embedding(String),
    #[error(
        "the rerank strategy is not available here (no reranker is configured): use hybrid or bm25"
    )]
    NoReranker,
}

/// An immutable index over a catalog snapshot. See the crate docs.
#[derive(Debug, Clone)]
pub struct SearchIndex {
    docs: Vec<ToolDoc>,
    by_id: HashMap<String, usize>,
    /// Position of each document in id order, for tie-breaking.
    id_rank: Vec<u32>,
    /// Per document, which distinct (server, server description) it has:
    /// tools of one server share that text, so it is matched once.
    server_of: Vec<u32>,
    bm25: bm25::Bm25,
    /// Tool vectors, when an embedder is attached.
    vectors: Option<embed::DocVectors>,
    hybrid: HybridParams,
    reranker: Option<rerank::RerankerSlot>,
}

impl SearchIndex {
    /// Indexes `docs` with the default (tuned) BM25F parameters. When two
    /// documents share an id, the first one is kept.
    pub fn build(docs: Vec<ToolDoc>) -> Self {
        Self::build_with(docs, &Bm25Params::default())
    }

    /// Indexes `docs` with explicit BM25F parameters.
    pub fn build_with(docs: Vec<ToolDoc>, params: &Bm25Params) -> Self {
        Self::build_cached(docs, params, &mut Bm25Cache::default())
    }

    /// Indexes `docs`, reusing the analysis of every document that `cache`
    /// holds unchanged (see [`Bm25Cache`]): the way to rebuild after a
    /// catalog change. Gives the same index as [`SearchIndex::build_with`].
    pub fn build_cached(docs: Vec<ToolDoc>, params: &Bm25Params, cache: &mut Bm25Cache) -> Self {
        let mut by_id = HashMap::with_capacity(docs.len());
        let docs: Vec<ToolDoc> = docs
            .into_iter()
            .filter(|d| {
                let fresh = !by_id.contains_key(&d.id);
                if fresh {
                    by_id.insert(d.id.clone(), by_id.len());
                }
                fresh
            })
            .collect();

        let mut order: Vec<usize> = (0..docs.len()).collect();
        order.sort_unstable_by(|&a, &b| docs[a].id.cmp(&docs[b].id));
        let mut id_rank = vec![0u32; docs.len()];
        for (rank, &d) in order.iter().enumerate() {
            id_rank[d] = rank as u32;
        }

        let mut servers = HashMap::new();
        let server_of = docs
            .iter()
            .map(|d| {
                let next = servers.len() as u32;
                *servers
                    .entry((&d.server, &d.server_description))
                    .or_insert(next)
            })
            .collect();

        let bm25 = bm25::Bm25::build(&docs, params, cache);
        Self {
            docs,
            by_id,
            id_rank,
            server_of,
            bm25,
            vectors: None,
            hybrid: HybridParams::default(),
            reranker: None,
        }
    }

    /// Embeds every tool with `embedder` and enables the `embedding` and
    /// `hybrid` strategies. Blocks for as long as the embedder takes: wrap the
    /// embedder in a cache (`manifold-embed`) so that a rebuild only embeds
    /// tools whose text changed.
    pub fn with_embeddings(mut self, embedder: Arc<dyn Embedder>) -> Result<Self, EmbedError> {
        self.embed(embedder, None)?;
        Ok(self)
    }

    /// [`SearchIndex::with_embeddings`], taking the vector of every tool
    /// that `previous` (an index of an earlier catalog) holds unchanged from
    /// the same model: after one server changed, only its tools are
    /// embedded, and the rest costs a comparison and a copy.
    pub fn with_embeddings_from(
        mut self,
        embedder: Arc<dyn Embedder>,
        previous: &SearchIndex,
    ) -> Result<Self, EmbedError> {
        self.embed(embedder, Some(previous))?;
        Ok(self)
    }

    /// Attaches vectors in place (see [`SearchIndex::with_embeddings_from`]);
    /// on an error the index is left as it was.
    pub fn embed(
        &mut self,
        embedder: Arc<dyn Embedder>,
        previous: Option<&SearchIndex>,
    ) -> Result<(), EmbedError> {
        self.vectors = Some(embed::DocVectors::build(&self.docs, embedder, previous)?);
        Ok(())
    }

    /// Enables the `rerank` strategy with `reranker`.
    pub fn with_reranker(mut self, reranker: Arc<dyn Reranker>) -> Self {
        self.reranker = Some(rerank::RerankerSlot(reranker));
        self
    }

    /// Whether a reranker is attached.
    pub fn has_reranker(&self) -> bool {
        self.reranker.is_some()
    }

    /// Replaces the tuning of the `hybrid` strategy.
    pub fn with_hybrid_params(mut self, params: HybridParams) -> Self {
        self.hybrid = params;
        self
    }

    /// Whether tool vectors are attached (see [`SearchIndex::with_embeddings`]).
    pub fn has_embeddings(&self) -> bool {
        self.vectors.is_some()
    }

    /// Number of indexed tools.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    /// Whether the index holds no tool.
    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    /// All indexed tools, in build order.
    pub fn docs(&self) -> &[ToolDoc] {
        &self.docs
    }

    /// The tool with this id.
    pub fn doc(&self, id: &str) -> Option<&ToolDoc> {
        self.by_id.get(id).map(|&d| &self.docs[d])
    }

    /// The `limit` best visible tools for a free-text query, ranked by BM25F.
    ///
    /// The query may be a few keywords or a long task description; stopwords
    /// and punctuation are ignored. Tools for which `filter` returns false are
    /// skipped. A query with no indexed term returns nothing.
    pub fn search(&self, query: &str, limit: usize, filter: &dyn Fn(&ToolDoc) -> bool) -> Vec<Hit> {
        if limit == 0 || self.docs.is_empty() {
            return Vec::new();
        }
        let mut scores = vec![0.0f32; self.docs.len()];
        let touched = self.bm25.score(query, &mut scores);
        let candidates = touched
            .into_iter()
            .map(|d| (d, scores[d as usize]))
            .collect();
        self.rank(candidates, limit, filter)
    }

    /// The `limit` best visible tools whose name, id, title, description or
    /// server matches `pattern` (case-insensitive unless it says `(?-i)`).
    /// Name matches rank above title, description, then server matches.
    ///
    /// Refuses patterns longer than [`MAX_PATTERN_LEN`] characters or whose
    /// compiled form exceeds [`MAX_COMPILED_SIZE`] bytes.
    pub fn search_regex(
        &self,
        pattern: &str,
        limit: usize,
        filter: &dyn Fn(&ToolDoc) -> bool,
    ) -> Result<Vec<Hit>, SearchError> {
        let re = regex::compile(pattern)?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Whether each server's text matches, decided on first need.
        // (There are at most as many servers as documents.)
        let mut server_hit: Vec<Option<bool>> = vec![None; self.docs.len()];
        let candidates = self
            .docs
            .iter()
            .zip(&self.server_of)
            .enumerate()
            .map(|(d, (doc, &server))| {
                let hit = &mut server_hit[server as usize];
                let score = regex::score(&re, doc, || {
                    *hit.get_or_insert_with(|| regex::server_matches(&re, doc))
                });
                (d as u32, score)
            })
            .filter(|&(_, s)| s > 0.0)
            .collect();
        Ok(self.rank(candidates, limit, filter))
    }

    /// Runs `query` with the given strategy.
    pub fn query(
        &self,
        strategy: Strategy,
        query: &str,
        limit: usize,
        filter: &dyn Fn(&ToolDoc) -> bool,
    ) -> Result<Vec<Hit>, SearchError> {
        self.run(strategy, query, limit, filter)
            .map(|(_, hits)| hits)
    }

    /// Runs `query` with the given strategy and says which strategy really
    /// ranked the hits: `hybrid` without vectors is `bm25`, and `rerank`
    /// whose reranker failed is `hybrid` (or `bm25`).
    pub fn run(
        &self,
        strategy: Strategy,
        query: &str,
        limit: usize,
        filter: &dyn Fn(&ToolDoc) -> bool,
    ) -> Result<(Strategy, Vec<Hit>), SearchError> {
        let hybrid_ran = if self.vectors.is_some() {
            Strategy::Hybrid
        } else {
            Strategy::Bm25
        };
        match strategy {
            Strategy::Bm25 => Ok((strategy, self.search(query, limit, filter))),
            Strategy::Regex => Ok((strategy, self.search_regex(query, limit, filter)?)),
            Strategy::Embedding => Ok((strategy, self.search_embedding(query, limit, filter)?)),
            Strategy::Hybrid => Ok((hybrid_ran, self.search_hybrid(query, limit, filter)?)),
            Strategy::Rerank => {
                let reranker = &self.reranker.as_ref().ok_or(SearchError::NoReranker)?.0;
                let base = self.search_hybrid(query, reranker.top_k().max(limit), filter)?;
                if base.len() < 2 {
                    return Ok((Strategy::Rerank, base));
                }
                let docs: Vec<&ToolDoc> = base.iter().filter_map(|h| self.doc(&h.id)).collect();
                match reranker.rerank(query, &docs) {
                    Ok(order) => {
                        let mut hits = rerank::apply(base, &order);
                        hits.truncate(limit);
                        Ok((Strategy::Rerank, hits))
                    }
                    Err(_) => {
                        // The reranker reports its own failure; the caller
                        // still gets the hybrid ranking.
                        let mut hits = base;
                        hits.truncate(limit);
                        Ok((hybrid_ran, hits))
                    }
                }
            }
        }
    }

    /// The `limit` visible tools whose vectors are closest to the query's
    /// (cosine similarity). Every tool gets a score, so the limit is always
    /// filled from the visible tools.
    ///
    /// Fails with [`SearchError::NoEmbeddings`] when no embedder is attached,
    /// and with [`SearchError::Embedding`] when the query cannot be embedded.
    pub fn search_embedding(
        &self,
        query: &str,
        limit: usize,
        filter: &dyn Fn(&ToolDoc) -> bool,
    ) -> Result<Vec<Hit>, SearchError> {
        let vectors = self.vectors.as_ref().ok_or(SearchError::NoEmbeddings)?;
        if limit == 0 || self.docs.is_empty() {
            return Ok(Vec::new());
        }
        let cosine = vectors
            .similarities(query)
            .map_err(|e| SearchError::Embedding(e.0))?;
        let candidates = (0..self.docs.len() as u32).zip(cosine).collect();
        Ok(self.rank(candidates, limit, filter))
    }

    /// BM25F and embedding rankings fused (see [`HybridParams`]). Ranks are
    /// taken among visible tools only, so hidden tools do not shift them.
    ///
    /// Without an attached embedder this is [`SearchIndex::search`], so it is
    /// a safe default strategy. Fails with [`SearchError::Embedding`] when the
    /// query cannot be embedded.
    pub fn search_hybrid(
        &self,
        query: &str,
        limit: usize,
        filter: &dyn Fn(&ToolDoc) -> bool,
    ) -> Result<Vec<Hit>, SearchError> {
        let Some(vectors) = &self.vectors else {
            return Ok(self.search(query, limit, filter));
        };
        if limit == 0 || self.docs.is_empty() {
            return Ok(Vec::new());
        }
        let steps = if self.hybrid.clause_weight > 0.0 {
            clauses::split(query)
        } else {
            Vec::new()
        };
        let embed_steps = self.hybrid.clause_embedding && !steps.is_empty();
        let mut texts = vec![query];
        if embed_steps {
            texts.extend(&steps);
        }
        let mut query_vectors = vectors
            .query_vectors(&texts)
            .map_err(|e| SearchError::Embedding(e.0))?
            .into_iter();
        let q = query_vectors.next().unwrap_or_default();
        let clause_cosine: Vec<Vec<f32>> =
            query_vectors.map(|v| vectors.similarities_to(&v)).collect();
        let mut cosine = vectors.similarities_to(&q);
        let mut bm25 = vec![0.0f32; self.docs.len()];
        self.bm25.score(query, &mut bm25);
        let clause_bm25: Vec<Vec<f32>> = steps
            .iter()
            .map(|s| {
                let mut scores = vec![0.0f32; self.docs.len()];
                self.bm25.score(s, &mut scores);
                scores
            })
            .collect();
        let visible: Vec<bool> = self.docs.iter().map(filter).collect();
        let fuse = |cosine: &[f32]| {
            hybrid::fuse(
                &self.hybrid,
                &hybrid::Rankings {
                    bm25: &bm25,
                    cosine,
                    clause_bm25: &clause_bm25,
                    clause_cosine: &clause_cosine,
                    visible: &visible,
                    id_rank: &self.id_rank,
                    server_of: &self.server_of,
                },
            )
        };
        let mut fused = fuse(&cosine);
        if self.hybrid.feedback > 0.0 && self.hybrid.feedback_docs > 0 {
            let mut top: Vec<u32> = (0..fused.len() as u32)
                .filter(|&d| fused[d as usize] > 0.0)
                .collect();
            top.sort_by(|a, b| fused[*b as usize].total_cmp(&fused[*a as usize]));
            top.truncate(self.hybrid.feedback_docs);
            let moved = vectors.moved_toward(&q, &top, self.hybrid.feedback);
            cosine = vectors.similarities_to(&moved);
            fused = fuse(&cosine);
        }
        let candidates = fused
            .into_iter()
            .enumerate()
            .filter(|&(_, s)| s > 0.0)
            .map(|(d, s)| (d as u32, s))
            .collect();
        Ok(self.rank(candidates, limit, filter))
    }

    /// Up to `n` ids of tools whose id or name is close to `name` (by edit
    /// distance, or by one containing the other), closest first. Meant for
    /// "unknown tool; did you mean ...?" errors.
    ///
    /// It does not filter: callers that hide tools must drop hidden ids.
    pub fn suggest(&self, name: &str, n: usize) -> Vec<String> {
        suggest::suggest(&self.docs, name, n)
    }

    /// Orders candidates by score descending, then id ascending, and keeps
    /// the first `limit` that pass `filter`.
    ///
    /// Only the head of the ranking is sorted: the best `limit` candidates,
    /// then (if the filter hid some) the next batch, doubling each time. The
    /// filter is only asked about candidates that could still make the cut.
    fn rank(
        &self,
        mut candidates: Vec<(u32, f32)>,
        limit: usize,
        filter: &dyn Fn(&ToolDoc) -> bool,
    ) -> Vec<Hit> {
        let order = |a: &(u32, f32), b: &(u32, f32)| {
            b.1.total_cmp(&a.1)
                .then_with(|| self.id_rank[a.0 as usize].cmp(&self.id_rank[b.0 as usize]))
        };
        let mut hits = Vec::with_capacity(limit.min(candidates.len()));
        let mut rest = candidates.as_mut_slice();
        let mut batch = limit.max(1);
        while hits.len() < limit && !rest.is_empty() {
            let k = batch.min(rest.len());
            if k < rest.len() {
                rest.select_nth_unstable_by(k - 1, order);
            }
            let (head, tail) = rest.split_at_mut(k);
            head.sort_unstable_by(order);
            for &(d, score) in head.iter() {
                let doc = &self.docs[d as usize];
                if filter(doc) {
                    hits.push(Hit {
                        id: doc.id.clone(),
                        score,
                    });
                    if hits.len() == limit {
                        break;
                    }
                }
            }
            rest = tail;
            batch = batch.saturating_mul(2);
        }
        hits
    }
}

#[cfg(test)]
mod tests;
