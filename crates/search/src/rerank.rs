//! The optional `rerank` strategy: a model re-orders the best tools of the
//! `hybrid` ranking. Its implementations (a chat endpoint) live in
//! `manifold-embed`; this crate only says what one must do and falls back to
//! `hybrid` whenever it fails.

use std::fmt;
use std::sync::Arc;

use crate::{EmbedError, ToolDoc};

/// Re-orders candidate tools for a query. Calls block (an HTTP request):
/// implementations must bound their own time (a timeout) and fail rather
/// than wait; a failure makes the search fall back to `hybrid`.
pub trait Reranker: Send + Sync {
    /// How many of the `hybrid` ranking's best tools are re-ordered.
    fn top_k(&self) -> usize;

    /// Positions in `candidates`, best first. Positions it leaves out keep
    /// their `hybrid` order after the ones it names; unknown or repeated
    /// positions are ignored.
    fn rerank(&self, query: &str, candidates: &[&ToolDoc]) -> Result<Vec<usize>, EmbedError>;
}

#[derive(Clone)]
pub(crate) struct RerankerSlot(pub Arc<dyn Reranker>);

impl fmt::Debug for RerankerSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reranker")
            .field("top_k", &self.0.top_k())
            .finish()
    }
}

/// `base` re-ordered as `order` says (see [`Reranker::rerank`]), scored by
/// position so that scores still descend.
pub(crate) fn apply(base: Vec<crate::Hit>, order: &[usize]) -> Vec<crate::Hit> {
    let mut taken = vec![false; base.len()];
    let mut positions = Vec::with_capacity(base.len());
    for &i in order {
        if i < base.len() && !taken[i] {
            taken[i] = true;
            positions.push(i);
        }
    }
    positions.extend((0..base.len()).filter(|&i| !taken[i]));
    let n = positions.len();
    let mut slots: Vec<Option<crate::Hit>> = base.into_iter().map(Some).collect();
    positions
        .into_iter()
        .enumerate()
        .filter_map(|(rank, i)| {
            slots[i].take().map(|mut hit| {
                hit.score = (n - rank) as f32;
                hit
            })
        })
        .collect()
}
