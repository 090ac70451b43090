//! Retrieval figures of one ranked list against its labelled relevant tools,
//! and paired bootstrap intervals for the difference between two runs over
//! the same queries.
//!
//! Pure functions over ids and numbers: the evaluation command reads the data
//! sets and runs the searches; this module says what each query scored and how
//! sure a difference is. A difference of means over few queries (43 on the
//! LiveMCPBench dev set, where one query moves nDCG@10 by up to 0.023) needs
//! its interval before it means anything.

use std::collections::HashSet;

/// What one query scored. `recall` and `complete` follow the cut-offs given
/// to [`score`], in that order.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryScores {
    /// Share of the relevant tools in the top k.
    pub recall: Vec<f64>,
    /// 1 when every relevant tool is in the top k (Completeness@k), else 0:
    /// what an agent needs from one search for a task that takes several tools.
    pub complete: Vec<f64>,
    /// nDCG@10 with binary gains.
    pub ndcg10: f64,
    /// Reciprocal rank of the first relevant tool in the list (0 if none).
    pub mrr: f64,
    /// 1 when the first result is relevant, else 0.
    pub hit1: f64,
}

/// Scores `ranked` (best first) against `relevant`, at each cut-off in `ks`.
/// Duplicate relevant ids count once; an empty `relevant` scores 0 throughout.
pub fn score<S: AsRef<str>, R: AsRef<str>>(
    ranked: &[S],
    relevant: &[R],
    ks: &[usize],
) -> QueryScores {
    let rel: HashSet<&str> = relevant.iter().map(AsRef::as_ref).collect();
    let n_rel = rel.len();
    let is_rel = |id: &S| rel.contains(id.as_ref());
    let found_in = |k: usize| ranked.iter().take(k).filter(|id| is_rel(id)).count();
    let per_k = |f: &dyn Fn(usize) -> f64| {
        ks.iter()
            .map(|&k| if n_rel == 0 { 0.0 } else { f(k) })
            .collect()
    };
    let recall = per_k(&|k| found_in(k) as f64 / n_rel as f64);
    let complete = per_k(&|k| f64::from(u8::from(found_in(k) == n_rel)));
    let gain = |i: usize| 1.0 / (i as f64 + 2.0).log2();
    let dcg: f64 = ranked
        .iter()
        .take(10)
        .enumerate()
        .filter(|(_, id)| is_rel(id))
        .map(|(i, _)| gain(i))
        .sum();
    let idcg: f64 = (0..n_rel.min(10)).map(gain).sum();
    QueryScores {
        recall,
        complete,
        ndcg10: if idcg > 0.0 { dcg / idcg } else { 0.0 },
        mrr: ranked
            .iter()
            .position(is_rel)
            .map_or(0.0, |p| 1.0 / (p as f64 + 1.0)),
        hit1: f64::from(u8::from(ranked.first().is_some_and(is_rel))),
    }
}

/// A mean and its percentile interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    pub mean: f64,
    pub low: f64,
    pub high: f64,
}

/// How a bootstrap is run. [`Default`]: 10,000 resamples, a 95% interval,
/// a fixed seed (the same inputs give the same interval).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bootstrap {
    pub resamples: usize,
    /// Coverage of the interval, e.g. 0.95.
    pub level: f64,
    pub seed: u64,
}

impl Default for Bootstrap {
    fn default() -> Self {
        Self {
            resamples: 10_000,
            level: 0.95,
            seed: 46,
        }
    }
}

impl Bootstrap {
    /// The mean of `after - before` over paired per-query values, with its
    /// interval: queries are resampled with replacement, each keeping its
    /// pair, so what the two runs share (the hard queries) cancels out.
    /// Panics if the two slices differ in length.
    pub fn paired(&self, before: &[f64], after: &[f64]) -> Interval {
        assert_eq!(before.len(), after.len(), "paired values differ in count");
        let diffs: Vec<f64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
        self.mean_of_sets(&[&diffs])
    }

    /// The mean of a per-query value with its interval.
    pub fn mean(&self, values: &[f64]) -> Interval {
        self.mean_of_sets(&[values])
    }

    /// The mean over sets of each set's mean (e.g. the dev-set mean of three
    /// data sets' figures), with its interval: each resample draws every set's
    /// queries from that set alone. Paired differences go in as values.
    /// Empty sets are left out.
    pub fn mean_of_sets(&self, sets: &[&[f64]]) -> Interval {
        let sets: Vec<&[f64]> = sets.iter().copied().filter(|s| !s.is_empty()).collect();
        if sets.is_empty() {
            return Interval {
                mean: 0.0,
                low: 0.0,
                high: 0.0,
            };
        }
        let mean_of = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
        let mean = sets.iter().map(|s| mean_of(s)).sum::<f64>() / sets.len() as f64;
        let mut rng = SplitMix64(self.seed);
        let mut means: Vec<f64> = (0..self.resamples.max(1))
            .map(|_| {
                sets.iter()
                    .map(|s| {
                        let total: f64 = (0..s.len()).map(|_| s[rng.below(s.len())]).sum();
                        total / s.len() as f64
                    })
                    .sum::<f64>()
                    / sets.len() as f64
            })
            .collect();
        means.sort_by(f64::total_cmp);
        let tail = (1.0 - self.level.clamp(0.0, 1.0)) / 2.0;
        let at = |p: f64| means[((means.len() - 1) as f64 * p).round() as usize];
        Interval {
            mean,
            low: at(tail),
            high: at(1.0 - tail),
        }
    }
}

/// A small, fixed pseudo-random sequence (SplitMix64): reproducible
/// intervals without a dependency.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), by multiply-shift.
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_a_ranked_list() {
        let ranked = ["a", "x", "b", "y", "c"];
        let s = score(&ranked, &["a", "b", "c"], &[1, 3, 5]);
        assert_eq!(s.recall, vec![1.0 / 3.0, 2.0 / 3.0, 1.0]);
        assert_eq!(s.complete, vec![0.0, 0.0, 1.0]);
        assert_eq!(s.hit1, 1.0);
        assert_eq!(s.mrr, 1.0);
        let dcg = 1.0 + 1.0 / 4f64.log2() + 1.0 / 6f64.log2();
        let idcg = 1.0 + 1.0 / 3f64.log2() + 1.0 / 4f64.log2();
        assert!((s.ndcg10 - dcg / idcg).abs() < 1e-12);
    }

    #[test]
    fn misses_and_empty_labels_score_zero() {
        let s = score(&["x", "y", "a"], &["a"], &[1, 2]);
        assert_eq!((s.hit1, s.mrr), (0.0, 1.0 / 3.0));
        assert_eq!(s.complete, vec![0.0, 0.0]);
        let none: [&str; 0] = [];
        let s = score(&["x"], &none, &[1]);
        assert_eq!(
            (s.recall[0], s.complete[0], s.ndcg10, s.mrr),
            (0.0, 0.0, 0.0, 0.0)
        );
        // A relevant tool past the top 10 counts for MRR, not for nDCG@10.
        let ranked: Vec<String> = (0..11).map(|i| format!("t{i}")).collect();
        let s = score(&ranked, &["t10"], &[10]);
        assert_eq!((s.ndcg10, s.recall[0]), (0.0, 0.0));
        assert!((s.mrr - 1.0 / 11.0).abs() < 1e-12);
    }

    #[test]
    fn duplicate_labels_count_once() {
        let s = score(&["a", "b"], &["a", "a", "b"], &[2]);
        assert_eq!((s.recall[0], s.complete[0], s.ndcg10), (1.0, 1.0, 1.0));
    }

    #[test]
    fn paired_interval_holds_the_difference_and_repeats() {
        let before: Vec<f64> = (0..200).map(|i| f64::from(i % 2)).collect();
        let after: Vec<f64> = before
            .iter()
            .enumerate()
            .map(|(i, b)| if i % 10 == 0 { 1.0 } else { *b })
            .collect();
        let b = Bootstrap::default();
        let d = b.paired(&before, &after);
        // Every tenth query is even, so it goes from 0 to 1: 20 of 200.
        assert!((d.mean - 0.1).abs() < 1e-12, "{d:?}");
        assert!(d.low > 0.0 && d.low < d.mean && d.mean < d.high, "{d:?}");
        assert_eq!(d, b.paired(&before, &after), "the seed fixes the interval");
        // Identical runs: no difference, and no width.
        let same = b.paired(&before, &before);
        assert_eq!((same.mean, same.low, same.high), (0.0, 0.0, 0.0));
    }

    #[test]
    fn one_query_that_moves_is_no_sure_gain() {
        let before = vec![0.5; 43];
        let mut after = before.clone();
        after[0] = 1.0;
        let d = Bootstrap::default().paired(&before, &after);
        assert!(d.mean > 0.0 && d.low == 0.0, "{d:?}");
    }

    #[test]
    fn mean_of_sets_weighs_sets_not_queries() {
        let small = [1.0; 4];
        let large = [0.0; 400];
        let m = Bootstrap::default().mean_of_sets(&[&small, &large, &[]]);
        assert_eq!((m.mean, m.low, m.high), (0.5, 0.5, 0.5));
        let spread: Vec<f64> = (0..100).map(|i| f64::from(i % 2)).collect();
        let m = Bootstrap::default().mean(&spread);
        assert!(
            (m.mean - 0.5).abs() < 1e-12 && m.low < 0.45 && m.high > 0.55,
            "{m:?}"
        );
    }
}
