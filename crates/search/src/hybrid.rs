//! Fusion of the BM25F and embedding rankings for the `hybrid` strategy.

/// How the two rankings are combined.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fusion {
    /// Reciprocal rank fusion: `Σ w / (k + rank)`, ranks from 1.
    Rrf { k: f32 },
    /// Each ranking's scores scaled to [0, 1] over its top `depth`
    /// (best = 1, the `depth`-th = 0), then added with their weights.
    Weighted,
}

/// Tuning of the `hybrid` strategy. [`Default`] holds the tuned values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HybridParams {
    pub fusion: Fusion,
    /// Weight of the BM25F ranking; the embedding ranking weighs `1 − this`.
    pub bm25_weight: f32,
    /// How many of each ranking's best tools take part.
    pub depth: usize,
    /// Adds this times the best fused score among a tool's server's tools, so
    /// that the tools of a server that fits the query as a whole move up
    /// together (tasks often need several tools of one server).
    pub server_boost: f32,
    /// Pseudo-relevance feedback: after a first fusion, the query vector
    /// moves this far toward the mean of the best `feedback_docs` tools'
    /// vectors and the fusion is done again (0 = off).
    pub feedback: f32,
    pub feedback_docs: usize,
    /// Share of the fusion that goes to a task's steps (`clauses::split`):
    /// each step's own BM25F ranking (and its cosine ranking, with
    /// `clause_embedding`) joins the whole query's two, the steps sharing
    /// this weight equally. 0 = off; queries of one step are never split.
    pub clause_weight: f32,
    /// Embed each step too (in one batch with the whole query).
    pub clause_embedding: bool,
}

/// Tuned on the dev sets (`manifold-bench eval search`, see docs/search-quality.md):
/// RRF with k = 20 and BM25F at 0.4. The usual k = 60 at equal weights gives
/// 0.414 nDCG@10 on LiveMCPBench and 0.520 Hit@1 on MetaTool; this gives 0.426
/// and 0.549. Weighted score fusion reaches 0.58 Hit@1 on MetaTool's short
/// queries at BM25F 0.3 but drops LiveMCPBench below BM25F alone; adding the
/// server's best score (`server_boost`) moved nothing by more than 0.006.
impl Default for HybridParams {
    fn default() -> Self {
        Self {
            fusion: Fusion::Rrf { k: 20.0 },
            bm25_weight: 0.4,
            depth: 100,
            server_boost: 0.0,
            feedback: 0.0,
            feedback_docs: 3,
            clause_weight: 0.0,
            clause_embedding: false,
        }
    }
}

/// The inputs of one fusion, all indexed by document.
pub(crate) struct Rankings<'a> {
    /// BM25F scores (0 where no query term matched).
    pub bm25: &'a [f32],
    /// Cosine similarities to the query.
    pub cosine: &'a [f32],
    /// Each step's BM25F scores and, when steps are embedded, cosines
    /// (empty without steps).
    pub clause_bm25: &'a [Vec<f32>],
    pub clause_cosine: &'a [Vec<f32>],
    /// Which documents the caller may see; the others take no rank.
    pub visible: &'a [bool],
    /// Tie-break order (position in id order).
    pub id_rank: &'a [u32],
    /// Server of each document, as a dense index.
    pub server_of: &'a [u32],
}

/// Fused score per document; 0 for documents in neither top `depth`.
pub(crate) fn fuse(p: &HybridParams, r: &Rankings<'_>) -> Vec<f32> {
    let n = r.bm25.len();
    let mut fused = vec![0.0f32; n];
    let whole = if r.clause_bm25.is_empty() {
        1.0
    } else {
        1.0 - p.clause_weight
    };
    let step = (1.0 - whole) / r.clause_bm25.len().max(1) as f32;
    let mut lists = vec![
        (r.bm25, whole * p.bm25_weight),
        (r.cosine, whole * (1.0 - p.bm25_weight)),
    ];
    // Without step vectors, the steps' share of the cosine side stays with
    // the whole query's cosine ranking.
    if r.clause_cosine.is_empty() {
        lists[1].1 = 1.0 - lists[0].1 - step * p.bm25_weight * r.clause_bm25.len() as f32;
    }
    lists.extend(
        r.clause_bm25
            .iter()
            .map(|s| (s.as_slice(), step * p.bm25_weight)),
    );
    lists.extend(
        r.clause_cosine
            .iter()
            .map(|s| (s.as_slice(), step * (1.0 - p.bm25_weight))),
    );
    for (scores, weight) in lists {
        let top = top_visible(scores, r, p.depth);
        match p.fusion {
            Fusion::Rrf { k } => {
                for (rank, &d) in top.iter().enumerate() {
                    fused[d as usize] += weight / (k + rank as f32 + 1.0);
                }
            }
            Fusion::Weighted => {
                let (Some(&best), Some(&last)) = (top.first(), top.last()) else {
                    continue;
                };
                let (hi, lo) = (scores[best as usize], scores[last as usize]);
                let span = (hi - lo).max(f32::EPSILON);
                for &d in &top {
                    fused[d as usize] += weight * (scores[d as usize] - lo) / span;
                }
            }
        }
    }
    if p.server_boost > 0.0 {
        let servers = r.server_of.iter().max().map_or(0, |&s| s as usize + 1);
        let mut best = vec![0.0f32; servers];
        for (d, &s) in fused.iter().enumerate() {
            let b = &mut best[r.server_of[d] as usize];
            *b = b.max(s);
        }
        for (d, s) in fused.iter_mut().enumerate() {
            if *s > 0.0 {
                *s += p.server_boost * best[r.server_of[d] as usize];
            }
        }
    }
    fused
}

/// The visible documents with a positive score, best first, at most `depth`.
fn top_visible(scores: &[f32], r: &Rankings<'_>, depth: usize) -> Vec<u32> {
    let mut top: Vec<u32> = (0..scores.len() as u32)
        .filter(|&d| r.visible[d as usize] && scores[d as usize] > 0.0)
        .collect();
    let order = |a: &u32, b: &u32| {
        scores[*b as usize]
            .total_cmp(&scores[*a as usize])
            .then_with(|| r.id_rank[*a as usize].cmp(&r.id_rank[*b as usize]))
    };
    if depth < top.len() {
        top.select_nth_unstable_by(depth, order);
        top.truncate(depth);
    }
    top.sort_unstable_by(order);
    top
}
