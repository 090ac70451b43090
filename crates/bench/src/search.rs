//! `manifold-bench search`: `search_tools` latency (search, grouping and
//! JSON rendering) at several catalog sizes.

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use manifold_catalog::{CatalogView, count_tokens, jsonl};
use manifold_cli::progress::Progress;
use manifold_search::Strategy;
use manifold_server::{Detail, Discovery};

use crate::stats::{percentile, us};

fn take_tools(
    listings: &[(String, String, Vec<rmcp::model::Tool>)],
    n: usize,
) -> Vec<(String, String, Vec<rmcp::model::Tool>)> {
    let mut left = n;
    let mut out = Vec::new();
    for (server, description, tools) in listings {
        if left == 0 {
            break;
        }
        let take: Vec<_> = tools.iter().take(left).cloned().collect();
        left -= take.len();
        out.push((server.clone(), description.clone(), take));
    }
    out
}

pub fn run(
    catalogs: &[PathBuf],
    sizes: &[String],
    queries: &PathBuf,
    iterations: usize,
    limit: usize,
) -> anyhow::Result<()> {
    let loaded = jsonl::read_catalogs(catalogs).map_err(anyhow::Error::msg)?;
    let total: usize = loaded.listings.iter().map(|l| l.2.len()).sum();
    let queries: Vec<String> = std::fs::read_to_string(queries)
        .with_context(|| format!("cannot read {}", queries.display()))?
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["query"].as_str().map(str::to_string))
        .collect();
    if queries.is_empty() {
        bail!("no queries found");
    }
    println!(
        "search_tools latency: search + grouping + JSON rendering, detail=summary, limit={limit}, {iterations} searches per size"
    );
    println!(
        "{:>7} {:>10} {:>10} {:>10} {:>12} {:>14}",
        "tools", "p50 µs", "p99 µs", "mean µs", "index ms", "result tokens"
    );
    for size in sizes {
        let n = if size == "all" {
            total
        } else {
            size.parse().context("size must be a number or 'all'")?
        };
        let view = CatalogView::from_listings(take_tools(&loaded.listings, n), true);
        let visible = manifold_broker::Visible {
            view: Arc::new(view),
            needs_approval: Default::default(),
        };
        let discovery = Discovery::default();
        let started = Instant::now();
        discovery.index(&visible.view);
        let index_ms = started.elapsed().as_secs_f64() * 1e3;
        let mut samples = Vec::with_capacity(iterations);
        let mut tokens = 0usize;
        let progress = Progress::new(&format!("{n} tools"), iterations as u64);
        for i in 0..iterations {
            progress.inc(1);
            let query = &queries[i % queries.len()];
            let t = Instant::now();
            let outcome = discovery
                .search(
                    &visible,
                    query,
                    Strategy::Bm25,
                    limit,
                    None,
                    Detail::Summary,
                )
                .map_err(anyhow::Error::msg)?;
            let text = serde_json::to_string(&outcome)?;
            samples.push(t.elapsed());
            if i < queries.len() {
                tokens += count_tokens(&text);
            }
        }
        progress.finish();
        samples.sort();
        let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
        println!(
            "{:>7} {:>10.1} {:>10.1} {:>10.1} {:>12.1} {:>14.0}",
            visible.view.tool_count(),
            us(percentile(&samples, 0.5)),
            us(percentile(&samples, 0.99)),
            us(mean),
            index_ms,
            tokens as f64 / queries.len().min(iterations) as f64
        );
    }
    Ok(())
}
