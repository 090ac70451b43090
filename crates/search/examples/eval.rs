//! Retrieval evaluation of the BM25F strategy on the shared benchmark data.
//!
//! ```text
//! cargo run --release -p manifold-search --example eval -- [--data DIR] [--set KEY=VALUE]...
//! ```
//!
//! `DIR` defaults to `../shared/data` beside the workspace. It reads
//! `catalogs/*.tools.jsonl` and `retrieval/*.dev.queries.jsonl` and prints, for
//! LiveMCPBench (527 tools), LiveMCPBench plus the docker registry as
//! distractors (5.6k tools) and MetaTool (199 tools): nDCG@10, Recall@5/10,
//! Completeness@10 (all relevant tools in the top 10), MRR (over the top 100),
//! Hit@1, the p50 and p99 latency of one `search` call with limit 10, and the
//! build time. It ends with the latency of `search_regex` and `suggest` on the
//! largest index.
//!
//! `--misses N` prints the first N queries per data set whose top hit is wrong.
//! `--set` overrides one ranking parameter, for tuning: `k1`, or
//! `FIELD.w` / `FIELD.b` with FIELD one of `name`, `server`, `sdesc`
//! (server description), `desc`, `params`.

use std::error::Error;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use manifold_search::{Bm25Params, SearchIndex, ToolDoc};
use serde_json::Value;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

struct Query {
    text: String,
    relevant: Vec<String>,
}

fn main() -> Result<()> {
    let mut data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data");
    let mut params = Bm25Params::default();
    let mut misses = 0usize;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--data" => data = PathBuf::from(args.next().ok_or("--data needs a directory")?),
            "--set" => set_param(&mut params, &args.next().ok_or("--set needs KEY=VALUE")?)?,
            "--misses" => misses = args.next().ok_or("--misses needs a count")?.parse()?,
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    println!("{params:?}\n");

    let live = load_catalog(&data.join("catalogs/livemcpbench.tools.jsonl"))?;
    let docker = load_catalog(&data.join("catalogs/docker_mcp_registry.tools.jsonl"))?;
    let metatool = load_catalog(&data.join("catalogs/metatool.tools.jsonl"))?;
    let live_q = load_queries(&data.join("retrieval/livemcpbench.dev.queries.jsonl"))?;
    let meta_q = load_queries(&data.join("retrieval/metatool.dev.queries.jsonl"))?;

    let with_distractors: Vec<ToolDoc> = live.iter().chain(&docker).cloned().collect();
    println!(
        "{:<28} {:>5} {:>6} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6} {:>8} {:>8} {:>8}",
        "data set",
        "tools",
        "qs",
        "nDCG@10",
        "R@5",
        "R@10",
        "C@10",
        "MRR",
        "Hit@1",
        "p50 µs",
        "p99 µs",
        "build ms"
    );
    let runs = [
        ("LiveMCPBench", live, &live_q),
        ("LiveMCPBench + distractors", with_distractors, &live_q),
        ("MetaTool", metatool, &meta_q),
    ];
    let mut largest = None;
    for (label, docs, queries) in runs {
        let index = evaluate(label, docs, queries, &params, misses);
        if largest
            .as_ref()
            .is_none_or(|l: &SearchIndex| l.len() < index.len())
        {
            largest = Some(index);
        }
    }
    if let Some(index) = largest {
        other_latencies(&index)?;
    }
    Ok(())
}

fn set_param(p: &mut Bm25Params, kv: &str) -> Result<()> {
    let (key, value) = kv.split_once('=').ok_or("--set takes KEY=VALUE")?;
    let value: f32 = value.parse()?;
    let (field, knob) = key.split_once('.').unwrap_or((key, ""));
    let field = match field {
        "k1" => {
            p.k1 = value;
            return Ok(());
        }
        "name" => &mut p.name,
        "server" => &mut p.server,
        "sdesc" => &mut p.server_description,
        "desc" => &mut p.description,
        "params" => &mut p.params,
        _ => return Err(format!("unknown parameter {key:?}").into()),
    };
    match knob {
        "w" => field.weight = value,
        "b" => field.b = value,
        _ => return Err(format!("unknown parameter {key:?}").into()),
    }
    Ok(())
}

fn load_catalog(path: &Path) -> Result<Vec<ToolDoc>> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut docs = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line)?;
        let s = |k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        docs.push(ToolDoc {
            id: s("id"),
            server: s("server"),
            server_description: s("server_description"),
            name: s("name"),
            title: v.get("title").and_then(Value::as_str).map(str::to_string),
            description: s("description"),
            params: v
                .get("input_schema")
                .map(ToolDoc::params_from_schema)
                .unwrap_or_default(),
        });
    }
    Ok(docs)
}

fn load_queries(path: &Path) -> Result<Vec<Query>> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut queries = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line)?;
        let relevant: Vec<String> = v["relevant"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if !relevant.is_empty() {
            queries.push(Query {
                text: v["query"].as_str().unwrap_or_default().to_string(),
                relevant,
            });
        }
    }
    Ok(queries)
}

#[derive(Default)]
struct Totals {
    ndcg10: f64,
    recall5: f64,
    recall10: f64,
    complete10: f64,
    mrr: f64,
    hit1: f64,
}

fn evaluate(
    label: &str,
    docs: Vec<ToolDoc>,
    queries: &[Query],
    params: &Bm25Params,
    misses: usize,
) -> SearchIndex {
    // Build time: the best of five builds, to see past a busy machine.
    let mut build_ms = f64::INFINITY;
    for _ in 0..4 {
        let docs = docs.clone();
        let started = Instant::now();
        std::hint::black_box(SearchIndex::build_with(docs, params));
        build_ms = build_ms.min(started.elapsed().as_secs_f64() * 1e3);
    }
    let started = Instant::now();
    let index = SearchIndex::build_with(docs, params);
    let build_ms = build_ms.min(started.elapsed().as_secs_f64() * 1e3);

    let mut t = Totals::default();
    let mut shown = 0;
    for q in queries {
        let hits = index.search(&q.text, 100, &|_| true);
        let ranked: Vec<&str> = hits.iter().map(|h| h.id.as_str()).collect();
        let rel = |id: &str| q.relevant.iter().any(|r| r == id);
        let found_in = |k: usize| ranked.iter().take(k).filter(|id| rel(id)).count() as f64;
        let n_rel = q.relevant.len() as f64;

        let dcg: f64 = ranked
            .iter()
            .take(10)
            .enumerate()
            .filter(|(_, id)| rel(id))
            .map(|(i, _)| 1.0 / (i as f64 + 2.0).log2())
            .sum();
        let idcg: f64 = (0..q.relevant.len().min(10))
            .map(|i| 1.0 / (i as f64 + 2.0).log2())
            .sum();
        t.ndcg10 += dcg / idcg;
        t.recall5 += found_in(5) / n_rel;
        t.recall10 += found_in(10) / n_rel;
        t.complete10 += f64::from(found_in(10) == n_rel);
        t.mrr += ranked
            .iter()
            .position(|id| rel(id))
            .map_or(0.0, |p| 1.0 / (p as f64 + 1.0));
        t.hit1 += f64::from(ranked.first().is_some_and(|id| rel(id)));
        if shown < misses && !ranked.first().is_some_and(|id| rel(id)) {
            shown += 1;
            eprintln!(
                "[{label}] {}\n  want {:?}\n  got  {:?}",
                q.text,
                q.relevant,
                &ranked[..ranked.len().min(5)]
            );
        }
    }

    // Latency of the call `search_tools` makes: limit 10, no filter. Small
    // query sets are repeated to get at least 2,000 samples.
    let rounds = 2000usize.div_ceil(queries.len().max(1));
    let mut micros = Vec::with_capacity(rounds * queries.len());
    for _ in 0..rounds {
        for q in queries {
            let started = Instant::now();
            std::hint::black_box(index.search(&q.text, 10, &|_| true));
            micros.push(started.elapsed().as_secs_f64() * 1e6);
        }
    }
    micros.sort_unstable_by(f64::total_cmp);
    let pct = |p: f64| micros[((micros.len() - 1) as f64 * p).round() as usize];

    let n = queries.len() as f64;
    println!(
        "{:<28} {:>5} {:>6} {:>7.3} {:>6.3} {:>6.3} {:>6.3} {:>6.3} {:>6.3} {:>8.1} {:>8.1} {:>8.1}",
        label,
        index.len(),
        queries.len(),
        t.ndcg10 / n,
        t.recall5 / n,
        t.recall10 / n,
        t.complete10 / n,
        t.mrr / n,
        t.hit1 / n,
        pct(0.5),
        pct(0.99),
        build_ms
    );
    index
}

/// Median time of the regex strategy and of suggestions on the largest index.
fn other_latencies(index: &SearchIndex) -> Result<()> {
    let median = |f: &dyn Fn()| {
        let mut micros: Vec<f64> = (0..101)
            .map(|_| {
                let started = Instant::now();
                f();
                started.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        micros.sort_unstable_by(f64::total_cmp);
        micros[50]
    };
    println!("\non {} tools (median of 101 runs):", index.len());
    for pattern in ["file", "^get_.*price", "(read|write)_file", r"\bpdf\b"] {
        index.search_regex(pattern, 10, &|_| true)?;
        let us = median(&|| {
            std::hint::black_box(index.search_regex(pattern, 10, &|_| true).ok());
        });
        println!("  search_regex({pattern:?}): {us:.0} µs");
    }
    for name in ["serach_papers", "write_fle", "github"] {
        let us = median(&|| {
            std::hint::black_box(index.suggest(name, 5));
        });
        println!(
            "  suggest({name:?}): {us:.0} µs -> {:?}",
            index.suggest(name, 3)
        );
    }
    Ok(())
}
