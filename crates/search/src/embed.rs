//! Dense vectors for the `embedding` and `hybrid` strategies.
//!
//! This crate only defines what an embedding model must do ([`Embedder`]) and
//! keeps one unit vector per tool; the models themselves (all-MiniLM-L6-v2 on
//! CPU, an OpenAI-compatible endpoint, the on-disk vector cache) live in
//! `manifold-embed`, so the BM25 path pulls in no tensor library.

use std::fmt;
use std::sync::Arc;

use crate::{SearchIndex, ToolDoc};

/// Turns text into vectors. Implementations must be deterministic for a given
/// [`model_id`](Embedder::model_id): cached vectors are keyed by it.
///
/// Calls block (a forward pass or an HTTP request): async callers should run
/// them on a blocking thread.
pub trait Embedder: Send + Sync {
    /// Names the model and everything else that changes its vectors.
    fn model_id(&self) -> &str;

    /// One vector per text, in order. Vectors need not be normalised.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError>;

    /// The vector of one search query. Caching wrappers pass queries through
    /// uncached: unlike tool texts, they rarely repeat.
    fn embed_query(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        self.embed(&[text])?
            .pop()
            .ok_or_else(|| EmbedError::new("the embedder returned no vector"))
    }

    /// The vectors of several queries at once (a task and its steps), in
    /// order; uncached like [`Embedder::embed_query`]. A model that batches
    /// should run them together: the weights then stream through once.
    fn embed_queries(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        texts.iter().map(|t| self.embed_query(t)).collect()
    }
}

/// Why texts could not be embedded (model files, tokenizer, endpoint).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EmbedError(pub String);

impl EmbedError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// The text a tool is embedded as: `server: name: title: description`, names
/// split into words. The server is left out when it only repeats the tool's
/// name (one-tool servers). Parameters are left out: they describe inputs,
/// not purpose, and dilute a small model's single vector. (On the dev sets the
/// server name adds about 0.045 nDCG@10 on LiveMCPBench.)
pub fn embedding_text(doc: &ToolDoc) -> String {
    let words = |s: &str| crate::tokenize::split_identifier(s).join(" ");
    let squash = |s: &str| s.replace(' ', "").to_lowercase();
    let name = words(&doc.name);
    let server = words(&doc.server);
    let mut text = String::new();
    if !server.is_empty() && squash(&server) != squash(&name) {
        text.push_str(&server);
        text.push_str(": ");
    }
    text.push_str(&name);
    for part in [doc.title.as_deref().unwrap_or(""), doc.description.as_str()] {
        let part = part.trim();
        if !part.is_empty() {
            text.push_str(": ");
            text.push_str(part);
        }
    }
    text
}

/// One unit vector per document, row-major, plus the model that made them.
#[derive(Clone)]
pub(crate) struct DocVectors {
    pub embedder: Arc<dyn Embedder>,
    pub dim: usize,
    pub data: Vec<f32>,
}

impl fmt::Debug for DocVectors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DocVectors")
            .field("model", &self.embedder.model_id())
            .field("dim", &self.dim)
            .field("docs", &(self.data.len() / self.dim.max(1)))
            .finish()
    }
}

impl DocVectors {
    /// Embeds every document (in one call, so a caching embedder sees the
    /// whole catalog at once) and normalises the vectors. Documents that
    /// `previous` holds unchanged, with vectors from the same model, take
    /// their vector from it: a rebuild embeds (or even hashes) only what
    /// changed.
    pub fn build(
        docs: &[ToolDoc],
        embedder: Arc<dyn Embedder>,
        previous: Option<&SearchIndex>,
    ) -> Result<Self, EmbedError> {
        let previous = previous
            .and_then(|p| p.vectors.as_ref().map(|v| (p, v)))
            .filter(|(_, v)| v.embedder.model_id() == embedder.model_id());
        let reused: Vec<Option<&[f32]>> = docs
            .iter()
            .map(|d| previous.and_then(|(p, v)| v.row_of(p, d)))
            .collect();
        let texts: Vec<String> = docs
            .iter()
            .zip(&reused)
            .filter(|(_, r)| r.is_none())
            .map(|(d, _)| embedding_text(d))
            .collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let vectors = if refs.is_empty() {
            Vec::new()
        } else {
            embedder.embed(&refs)?
        };
        if vectors.len() != texts.len() {
            return Err(EmbedError(format!(
                "the embedder returned {} vectors for {} texts",
                vectors.len(),
                texts.len()
            )));
        }
        let dim = (vectors.first().map(Vec::len))
            .or(previous.map(|(_, v)| v.dim))
            .unwrap_or(0);
        let mut data = Vec::with_capacity(dim * docs.len());
        let mut fresh = vectors.into_iter();
        for r in reused {
            let v = match r {
                Some(v) => v.to_vec(),
                None => normalized(fresh.next().unwrap_or_default()),
            };
            if v.len() != dim {
                return Err(EmbedError(format!(
                    "the embedder returned vectors of {} and {} dimensions",
                    dim,
                    v.len()
                )));
            }
            data.extend(v);
        }
        Ok(Self {
            embedder,
            dim,
            data,
        })
    }

    /// The vector of `doc` in `index` (whose vectors these are), if the
    /// index holds that tool exactly as `doc` is.
    fn row_of(&self, index: &SearchIndex, doc: &ToolDoc) -> Option<&[f32]> {
        let &i = index.by_id.get(&doc.id)?;
        (index.docs[i] == *doc).then(|| &self.data[i * self.dim..][..self.dim])
    }

    /// The query's unit vector.
    pub fn query_vector(&self, query: &str) -> Result<Vec<f32>, EmbedError> {
        self.checked(normalized(self.embedder.embed_query(query)?))
    }

    /// The unit vectors of several queries: one query alone goes through
    /// [`Embedder::embed_query`], more through [`Embedder::embed_queries`].
    pub fn query_vectors(&self, queries: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let raw = match queries {
            [one] => vec![self.embedder.embed_query(one)?],
            _ => self.embedder.embed_queries(queries)?,
        };
        if raw.len() != queries.len() {
            return Err(EmbedError(format!(
                "the embedder returned {} vectors for {} queries",
                raw.len(),
                queries.len()
            )));
        }
        raw.into_iter()
            .map(|v| self.checked(normalized(v)))
            .collect()
    }

    fn checked(&self, q: Vec<f32>) -> Result<Vec<f32>, EmbedError> {
        if q.len() != self.dim {
            return Err(EmbedError(format!(
                "the query vector has {} dimensions, the tool vectors {}",
                q.len(),
                self.dim
            )));
        }
        Ok(q)
    }

    /// Cosine similarity of every document to the query, in document order.
    pub fn similarities(&self, query: &str) -> Result<Vec<f32>, EmbedError> {
        Ok(self.similarities_to(&self.query_vector(query)?))
    }

    /// Cosine similarity of every document to a unit vector.
    pub fn similarities_to(&self, q: &[f32]) -> Vec<f32> {
        self.data
            .chunks_exact(self.dim)
            .map(|d| dot(d, q))
            .collect()
    }

    /// `q + weight × mean(docs)`, normalised: the query moved toward tools
    /// that ranked well for it.
    pub fn moved_toward(&self, q: &[f32], docs: &[u32], weight: f32) -> Vec<f32> {
        let mut v = q.to_vec();
        let scale = weight / docs.len().max(1) as f32;
        for &d in docs {
            let row = &self.data[d as usize * self.dim..][..self.dim];
            v.iter_mut().zip(row).for_each(|(a, b)| *a += scale * b);
        }
        normalized(v)
    }
}

/// `v / |v|`; a zero vector stays zero.
pub fn normalized(mut v: Vec<f32>) -> Vec<f32> {
    let norm = dot(&v, &v).sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

/// Dot product, in eight lanes so that it vectorises.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (a8, a_rest) = a.split_at(a.len() - a.len() % 8);
    let (b8, b_rest) = b.split_at(a8.len().min(b.len()));
    for (x, y) in a8.chunks_exact(8).zip(b8.chunks_exact(8)) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    let tail: f32 = a_rest.iter().zip(b_rest).map(|(x, y)| x * y).sum();
    lanes.iter().sum::<f32>() + tail
}
