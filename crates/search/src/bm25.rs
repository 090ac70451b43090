//! BM25F over five fields, with an inverted index.
//!
//! BM25F (Robertson, Zaragoza & Taylor 2004) normalises each field's term
//! frequency by that field's own length, weights the fields, adds them into one
//! pseudo-frequency per (term, document), and only then saturates it with `k1`:
//!
//! ```text
//! tf~(t, d) = Σ_f  w_f · tf_f(t, d) / (1 − b_f + b_f · len_f(d) / avglen_f)
//! score(q, d) = Σ_{t ∈ q}  idf(t) · tf~ / (k1 + tf~)
//! ```
//!
//! Weights and length normalisation are fixed once the index is built, so each
//! posting stores its final `tf~` and a query only sums `idf · saturation` over
//! the postings of its terms: the cost grows with the matches, not with the
//! catalog.

use std::collections::HashMap;
use std::sync::Arc;

use crate::ToolDoc;
use crate::tokenize::Analyzer;

/// Weight and length normalisation of one field.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FieldParams {
    /// How much one occurrence in this field counts, relative to the others.
    pub weight: f32,
    /// Length normalisation, 0 (none) to 1 (full).
    pub b: f32,
}

impl FieldParams {
    pub const fn new(weight: f32, b: f32) -> Self {
        Self { weight, b }
    }
}

/// Tuning of the BM25F ranking. [`Default`] holds the tuned values.
///
/// Names (the tool's and the server's) are short and say what a tool is for,
/// so they weigh three times the prose and get less length normalisation;
/// parameters describe inputs rather than purpose, so they weigh half. These
/// are round values from a coarse sweep on the dev sets (`manifold-bench eval search`),
/// whose neighbourhood is flat within about ±0.01 nDCG@10, not a fitted optimum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bm25Params {
    /// Term-frequency saturation.
    pub k1: f32,
    /// The tool's name, split into words.
    pub name: FieldParams,
    /// The server's name (plus any part of the qualified id that is
    /// neither the server's nor the tool's name).
    pub server: FieldParams,
    /// The server's description, shared by all of its tools.
    pub server_description: FieldParams,
    /// The tool's title and description.
    pub description: FieldParams,
    /// Parameter names and descriptions from the input schema.
    pub params: FieldParams,
}

impl Default for Bm25Params {
    fn default() -> Self {
        Self {
            k1: 1.2,
            name: FieldParams::new(3.0, 0.5),
            server: FieldParams::new(3.0, 0.5),
            server_description: FieldParams::new(1.0, 0.75),
            description: FieldParams::new(1.0, 0.75),
            params: FieldParams::new(0.5, 0.75),
        }
    }
}

impl Bm25Params {
    fn fields(&self) -> [FieldParams; FIELDS] {
        [
            self.name,
            self.server,
            self.server_description,
            self.description,
            self.params,
        ]
    }
}

const FIELDS: usize = 5;

#[derive(Debug, Clone, Copy)]
struct Posting {
    doc: u32,
    /// The weighted, length-normalised pseudo term frequency `tf~`.
    tf: f32,
}

/// The inverted index: term → postings, stored contiguously.
#[derive(Debug, Clone)]
pub(crate) struct Bm25 {
    k1: f32,
    /// Shared with the [`Bm25Cache`] it was built with; ids of terms no
    /// indexed document has get empty postings.
    terms: Arc<HashMap<String, u32>>,
    /// `postings[offsets[t]..offsets[t + 1]]` are the postings of term `t`.
    offsets: Vec<u32>,
    postings: Vec<Posting>,
    idf: Vec<f32>,
}

/// One document's terms with their per-field counts, and its field lengths:
/// everything BM25F needs from it before the collection's statistics.
#[derive(Debug)]
struct Analysed {
    counts: Vec<(u32, [u16; FIELDS])>,
    lens: [u32; FIELDS],
}

/// Analysed documents kept from one build to the next, so that a rebuild
/// after one server changed analyses only that server's tools. Analysis is
/// most of a build: tokenising, splitting identifiers and stemming.
///
/// Term ids come from an interner that only grows; when it holds far more
/// terms than the indexed documents use (tools that keep changing), it is
/// emptied and the next build starts afresh. Likewise documents no longer
/// indexed are dropped once they outnumber the indexed ones.
#[derive(Debug, Default)]
pub struct Bm25Cache {
    terms: Arc<HashMap<String, u32>>,
    /// By id: the document as analysed, and its analysis.
    docs: HashMap<String, (ToolDoc, Arc<Analysed>)>,
}

impl Bm25Cache {
    /// Documents whose analysis is kept.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    /// Terms interned.
    pub fn terms_len(&self) -> usize {
        self.terms.len()
    }

    /// Bounds the cache after a build of `indexed` documents using
    /// `used_terms` distinct terms.
    fn prune(&mut self, indexed: &[ToolDoc], used_terms: usize) {
        if self.terms.len() > 4 * used_terms + 100_000 {
            *self = Self::default();
            return;
        }
        if self.docs.len() > 2 * indexed.len() + 1024 {
            let keep: std::collections::HashSet<&str> =
                indexed.iter().map(|d| d.id.as_str()).collect();
            self.docs.retain(|id, _| keep.contains(id.as_str()));
        }
    }
}

/// Analyses documents into term ids with per-field counts.
struct Builder<'a> {
    analyzer: Analyzer,
    terms: Arc<HashMap<String, u32>>,
    /// Tools of one server share its text: it is analysed once per server.
    servers: HashMap<(&'a str, &'a str), ServerTerms>,
    /// Scratch: where each term sits in the current document's list, plus
    /// one (0: not seen yet in this document).
    slot: Vec<u32>,
}

struct ServerTerms {
    name: Vec<u32>,
    description: Vec<u32>,
}

impl<'a> Builder<'a> {
    /// Appends the term ids of `text` to `out`, in order.
    fn ids(&mut self, text: &str, out: &mut Vec<u32>) {
        let terms = &mut self.terms;
        self.analyzer.run(text, |t| {
            let id = match terms.get(t) {
                Some(&id) => id,
                None => {
                    // Copies the interner if an index still shares it: once
                    // per build that brings new terms.
                    let terms = Arc::make_mut(terms);
                    let id = terms.len() as u32;
                    terms.insert(t.to_string(), id);
                    id
                }
            };
            out.push(id);
        });
    }

    fn analyse(&mut self, doc: &'a ToolDoc) -> Analysed {
        let mut fields: [Vec<u32>; FIELDS] = Default::default();
        let [name, server, server_desc, description, params] = &mut fields;

        self.ids(&doc.name, name);

        let key = (doc.server.as_str(), doc.server_description.as_str());
        if !self.servers.contains_key(&key) {
            let mut terms = ServerTerms {
                name: Vec::new(),
                description: Vec::new(),
            };
            self.ids(key.0, &mut terms.name);
            self.ids(key.1, &mut terms.description);
            self.servers.insert(key, terms);
        }
        // The qualified id repeats the server and tool names; whatever else
        // it holds (a registry prefix, say) goes with the server's name.
        let mut id = Vec::new();
        self.ids(&doc.id, &mut id);
        let shared = &self.servers[&key];
        server.extend(&shared.name);
        server.extend(
            id.iter()
                .filter(|t| !name.contains(t) && !shared.name.contains(t)),
        );
        server_desc.extend(&shared.description);

        if let Some(title) = &doc.title {
            self.ids(title, description);
        }
        self.ids(&doc.description, description);

        for (param, text) in &doc.params {
            self.ids(param, params);
            self.ids(text, params);
        }

        self.count(&fields)
    }

    /// Turns the current document's field term lists into counts.
    fn count(&mut self, fields: &[Vec<u32>; FIELDS]) -> Analysed {
        self.slot.resize(self.terms.len(), 0);
        let mut counts: Vec<(u32, [u16; FIELDS])> = Vec::new();
        for (f, ids) in fields.iter().enumerate() {
            for &id in ids {
                let slot = &mut self.slot[id as usize];
                if *slot == 0 {
                    counts.push((id, [0; FIELDS]));
                    *slot = counts.len() as u32;
                }
                let c = &mut counts[*slot as usize - 1].1[f];
                *c = c.saturating_add(1);
            }
        }
        for &(id, _) in &counts {
            self.slot[id as usize] = 0;
        }
        Analysed {
            counts,
            lens: fields.each_ref().map(|f| f.len() as u32),
        }
    }
}

/// Weighs and normalises the documents' counts into the final postings.
fn finish(terms: Arc<HashMap<String, u32>>, docs: &[Arc<Analysed>], params: &Bm25Params) -> Bm25 {
    let fields = params.fields();
    let n = docs.len().max(1) as f32;
    let avg: [f32; FIELDS] = std::array::from_fn(|f| {
        let total: u64 = docs.iter().map(|d| u64::from(d.lens[f])).sum();
        (total as f32 / n).max(1.0)
    });

    // Lay the postings out term by term: count, then fill.
    let mut df = vec![0u32; terms.len()];
    for doc in docs {
        for &(term, _) in &doc.counts {
            df[term as usize] += 1;
        }
    }
    let mut offsets = Vec::with_capacity(df.len() + 1);
    offsets.push(0u32);
    for &d in &df {
        offsets.push(offsets[offsets.len() - 1] + d);
    }
    let mut fill = offsets.clone();
    let mut postings = vec![Posting { doc: 0, tf: 0.0 }; offsets[df.len()] as usize];
    for (d, doc) in docs.iter().enumerate() {
        let len = &doc.lens;
        let norm: [f32; FIELDS] =
            std::array::from_fn(|f| 1.0 - fields[f].b + fields[f].b * len[f] as f32 / avg[f]);
        for (term, tf) in &doc.counts {
            let tf = (0..FIELDS)
                .map(|f| fields[f].weight * f32::from(tf[f]) / norm[f])
                .sum();
            let at = &mut fill[*term as usize];
            postings[*at as usize] = Posting { doc: d as u32, tf };
            *at += 1;
        }
    }

    let idf = df
        .iter()
        .map(|&df| {
            let df = df as f32;
            (1.0 + (n - df + 0.5) / (df + 0.5)).ln()
        })
        .collect();
    Bm25 {
        k1: params.k1,
        terms,
        offsets,
        postings,
        idf,
    }
}

impl Bm25 {
    /// Indexes `docs`, analysing only those `cache` does not hold as they
    /// are, and keeps their analyses in `cache` for the next build.
    pub(crate) fn build(docs: &[ToolDoc], params: &Bm25Params, cache: &mut Bm25Cache) -> Self {
        let mut builder = Builder {
            analyzer: Analyzer::default(),
            terms: std::mem::take(&mut cache.terms),
            servers: HashMap::new(),
            slot: Vec::new(),
        };
        let mut analysed = Vec::with_capacity(docs.len());
        for doc in docs {
            match cache.docs.get(&doc.id) {
                Some((seen, a)) if seen == doc => analysed.push(Arc::clone(a)),
                _ => {
                    let a = Arc::new(builder.analyse(doc));
                    cache
                        .docs
                        .insert(doc.id.clone(), (doc.clone(), Arc::clone(&a)));
                    analysed.push(a);
                }
            }
        }
        cache.terms = builder.terms;
        let bm25 = finish(Arc::clone(&cache.terms), &analysed, params);
        let used = bm25.offsets.windows(2).filter(|w| w[1] > w[0]).count();
        cache.prune(docs, used);
        bm25
    }

    /// Adds the query's BM25F score into `scores` (one slot per document) and
    /// returns the documents that matched at least one term.
    pub(crate) fn score(&self, query: &str, scores: &mut [f32]) -> Vec<u32> {
        let mut q: Vec<u32> = Vec::new();
        Analyzer::default().run(query, |t| q.extend(self.terms.get(t)));
        // Each distinct term counts once: a long task description that
        // repeats a word is not asking for it twice as much.
        q.sort_unstable();
        q.dedup();

        let mut touched = Vec::new();
        for &t in &q {
            let t = t as usize;
            let idf = self.idf[t];
            let range = self.offsets[t] as usize..self.offsets[t + 1] as usize;
            for p in &self.postings[range] {
                // Zero when the term only occurs in fields weighted 0.
                let gain = idf * p.tf / (self.k1 + p.tf);
                if gain > 0.0 {
                    let slot = &mut scores[p.doc as usize];
                    if *slot == 0.0 {
                        touched.push(p.doc);
                    }
                    *slot += gain;
                }
            }
        }
        touched
    }
}
