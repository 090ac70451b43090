//! `manifold-bench eval search`: retrieval quality and cost of the search strategies
//! on labelled queries (the data sets in `../shared/data`).
//!
//! For each strategy it reports Recall@k and Completeness@k (every relevant
//! tool in the top k) for each k, nDCG@10, MRR (over the top 100), Hit@1, the
//! p50/p99 latency of one search with limit max(k) (query embedding included),
//! and the mean token size (o200k) of what `search_tools` would return at each
//! k with `detail=summary`. `--per-query` writes each query's figures, and
//! `--baseline` gives the paired bootstrap interval of each difference from an
//! earlier run's per-query file (`manifold_search::eval`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use manifold_catalog::{CatalogTool, CatalogView, count_tokens, jsonl, one_line, qualify};
use manifold_cli::progress::Progress;
use manifold_embed::{CachedEmbedder, EmbeddingConfig};
use manifold_search::eval::{self, Bootstrap, QueryScores};
use manifold_search::{
    Bm25Cache, Bm25Params, EmbedError, Embedder, Fusion, Hit, HybridParams, SearchIndex, Strategy,
    ToolDoc,
};
use serde_json::{Value, json};

#[derive(Subcommand)]
pub enum EvalCommand {
    /// Quality, latency and result size of search strategies on labelled queries.
    Search(Box<SearchArgs>),
}

#[derive(Args)]
pub struct SearchArgs {
    /// JSONL catalogs, comma-separated (their tools are searched together).
    #[arg(long, value_delimiter = ',', required = true)]
    catalog: Vec<PathBuf>,
    /// Labelled queries: JSONL with "query" and "relevant" (catalog ids).
    #[arg(long)]
    queries: PathBuf,
    /// Strategies to compare: bm25, regex, embedding, hybrid.
    #[arg(long, value_delimiter = ',', default_value = "bm25,embedding,hybrid")]
    strategy: Vec<Strategy>,
    /// Cut-offs for Recall@k, Completeness@k and result tokens.
    #[arg(long, value_delimiter = ',', default_value = "1,3,5,10")]
    k: Vec<usize>,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Local model directory (default: as the gateway finds it).
    #[arg(long, env = "MANIFOLD_EMBEDDING_MODEL_DIR")]
    model_dir: Option<PathBuf>,
    /// An OpenAI-compatible /v1/embeddings URL instead of the local model.
    #[arg(long)]
    embedding_url: Option<String>,
    /// Model name sent to --embedding-url; without it, the local model:
    /// tool-minilm-l6 (the default) or all-MiniLM-L6-v2 (the generic one).
    #[arg(long)]
    embedding_model: Option<String>,
    /// Per-request time limit for --embedding-url (default 10 s): a large
    /// model on a CPU needs more for a catalog's batches.
    #[arg(long)]
    embedding_timeout_ms: Option<u64>,
    /// Tool vector cache (default ~/.cache/manifold/embeddings).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Timed searches per strategy, cycling through the queries.
    #[arg(long, default_value_t = 1000)]
    latency_samples: usize,
    /// Result tokens are counted on the first this many queries.
    #[arg(long, default_value_t = 1000)]
    token_queries: usize,
    /// Print the first N queries per strategy whose top hit is wrong.
    #[arg(long, default_value_t = 0)]
    misses: usize,
    /// Write each query's figures and top 10 as JSONL (one line per strategy
    /// and query) to this file.
    #[arg(long)]
    per_query: Option<PathBuf>,
    /// An earlier run's --per-query file on the same queries: print each
    /// difference from it with its paired bootstrap 95% interval.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// With --per-query: also write each query's best N hits with their
    /// scores ("hits"), for studying a fusion offline.
    #[arg(long, default_value_t = 0)]
    dump_depth: usize,
    /// Tuning overrides: bm25.k1, bm25.FIELD.w, bm25.FIELD.b (FIELD: name,
    /// server, sdesc, desc, params), hybrid.fusion (rrf|weighted), hybrid.k,
    /// hybrid.w (BM25 weight), hybrid.depth, hybrid.boost, hybrid.clauses
    /// (the steps' share), hybrid.clause_embedding (0|1).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

pub fn run(command: EvalCommand) -> anyhow::Result<()> {
    match command {
        EvalCommand::Search(args) => eval_search(*args),
    }
}

struct Query {
    /// The query's "id" in the file (its line number when it has none).
    id: String,
    text: String,
    /// Qualified names of the relevant tools.
    relevant: Vec<String>,
}

/// Per-strategy totals over all queries, and each query's figures.
#[derive(Default)]
struct Totals {
    recall: Vec<f64>,
    complete: Vec<f64>,
    ndcg10: f64,
    mrr: f64,
    hit1: f64,
    tokens: Vec<f64>,
    token_queries: usize,
    errors: usize,
    per_query: Vec<(QueryScores, Vec<Hit>)>,
}

fn eval_search(args: SearchArgs) -> anyhow::Result<()> {
    let mut bm25 = Bm25Params::default();
    let mut hybrid = HybridParams::default();
    for kv in &args.set {
        set_param(&mut bm25, &mut hybrid, kv)?;
    }
    let mut ks = args.k.clone();
    ks.sort_unstable();
    ks.dedup();
    let Some(&max_k) = ks.last().filter(|&&k| k > 0) else {
        bail!("--k needs at least one positive cut-off");
    };

    let loaded = jsonl::read_catalogs(&args.catalog).map_err(anyhow::Error::msg)?;
    let qualified: HashMap<&str, String> = loaded
        .ids
        .iter()
        .map(|(id, server, name)| (id.as_str(), qualify(server, name)))
        .collect();
    let view = CatalogView::from_listings(loaded.listings.clone(), true);
    let queries = load_queries(&args.queries, &qualified)?;
    if queries.is_empty() {
        bail!(
            "{}: no query with a known relevant tool",
            args.queries.display()
        );
    }
    let docs: Vec<ToolDoc> = view.tools().map(|t| tool_doc(&view, t)).collect();

    let started = Instant::now();
    let mut bm25_cache = Bm25Cache::default();
    let mut index =
        SearchIndex::build_cached(docs.clone(), &bm25, &mut bm25_cache).with_hybrid_params(hybrid);
    let build_ms = started.elapsed().as_secs_f64() * 1e3;
    println!(
        "{} tools, {} queries; BM25F index built in {build_ms:.1} ms",
        index.len(),
        queries.len()
    );

    let mut memo = None;
    if args
        .strategy
        .iter()
        .any(|s| matches!(s, Strategy::Embedding | Strategy::Hybrid))
    {
        let config = EmbeddingConfig {
            model_dir: args.model_dir.clone(),
            url: args.embedding_url.clone(),
            model: args.embedding_model.clone(),
            timeout_ms: args.embedding_timeout_ms,
            cache_dir: args.cache_dir.clone(),
            ..EmbeddingConfig::default()
        };
        let search_from: Vec<PathBuf> = std::env::current_dir()
            .into_iter()
            .chain(std::env::current_exe().ok())
            .collect();
        let started = Instant::now();
        let cached = config.open(&search_from).map_err(anyhow::Error::msg)?;
        embedding_bar(&cached, "embedding tool texts");
        let load_ms = started.elapsed().as_secs_f64() * 1e3;
        let queries_memo = Arc::new(QueryMemo::new(Arc::clone(&cached)));
        let started = Instant::now();
        index = index
            .with_embeddings(Arc::clone(&queries_memo) as Arc<dyn Embedder>)
            .map_err(anyhow::Error::msg)?;
        println!(
            "embeddings: {} (loaded in {load_ms:.0} ms); tool vectors in {:.0} ms: {} embedded, {} from the cache",
            cached.model_id(),
            started.elapsed().as_secs_f64() * 1e3,
            cached.embedded(),
            cached.reused()
        );
        memo = Some(queries_memo);
        let r = reindex_one_server(&docs, &bm25, hybrid, &cached, &mut bm25_cache, &index)?;
        println!(
            "re-index after server {} ({} tools) changed: median {:.1} ms over 5 changes \
             (BM25F {:.1} ms, vectors {:.1} ms), of which {:.1} ms embedding its {} new texts",
            r.server, r.tools, r.total_ms, r.bm25_ms, r.vectors_ms, r.embed_ms, r.tools
        );
    }

    let mut report = BTreeMap::new();
    let mut rows = Vec::new();
    let mut per_query = Vec::new();
    let progress = Progress::new(
        "evaluating queries",
        (queries.len() * args.strategy.len()) as u64,
    );
    for &strategy in &args.strategy {
        if let Some(m) = &memo {
            m.memoize.store(true, Ordering::Relaxed);
        }
        let t = measure(&index, &view, strategy, &queries, &ks, &args, &progress);
        // Latency with every query embedded afresh.
        if let Some(m) = &memo {
            m.memoize.store(false, Ordering::Relaxed);
        }
        let (p50, p99) = latency(
            &index,
            strategy,
            &queries,
            max_k,
            args.latency_samples,
            &|_| true,
        );
        // A caller whose policy shows one server in fifty.
        let (p50_selective, _) = latency(
            &index,
            strategy,
            &queries,
            max_k,
            args.latency_samples,
            &selective,
        );
        let n = queries.len() as f64;
        let per_k = |v: &[f64], d: f64| -> BTreeMap<String, f64> {
            ks.iter()
                .zip(v)
                .map(|(k, x)| (k.to_string(), x / d))
                .collect()
        };
        let entry = json!({
            "recall": per_k(&t.recall, n),
            "completeness": per_k(&t.complete, n),
            "ndcg@10": t.ndcg10 / n,
            "mrr": t.mrr / n,
            "hit@1": t.hit1 / n,
            "p50_ms": p50.as_secs_f64() * 1e3,
            "p99_ms": p99.as_secs_f64() * 1e3,
            "p50_selective_ms": p50_selective.as_secs_f64() * 1e3,
            "tokens": per_k(&t.tokens, t.token_queries.max(1) as f64),
            "errors": t.errors,
        });
        rows.push((strategy, entry.clone()));
        report.insert(strategy.to_string(), entry);
        per_query.extend(per_query_rows(
            strategy,
            &queries,
            &ks,
            &t.per_query,
            args.dump_depth,
        ));
    }
    progress.finish();
    print_table(&rows, &ks);
    let visible = index.docs().iter().filter(|d| selective(d)).count();
    let selective_p50: Vec<String> = rows
        .iter()
        .map(|(s, v)| {
            format!(
                "{s} {:.3} ms",
                v["p50_selective_ms"].as_f64().unwrap_or(0.0)
            )
        })
        .collect();
    println!(
        "p50 for a caller who sees one server in fifty ({visible} of {} tools): {}",
        index.len(),
        selective_p50.join(", ")
    );

    if let Some(path) = &args.per_query {
        let text: String = per_query.iter().map(|r| format!("{r}\n")).collect();
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.baseline {
        print_differences(path, &per_query, &ks)?;
    }
    if let Some(path) = &args.json {
        let out = json!({
            "catalogs": args.catalog,
            "queries_file": args.queries,
            "tools": index.len(),
            "queries": queries.len(),
            "k": ks,
            "settings": args.set,
            "strategies": report,
        });
        std::fs::write(path, serde_json::to_string_pretty(&out)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn measure(
    index: &SearchIndex,
    view: &CatalogView,
    strategy: Strategy,
    queries: &[Query],
    ks: &[usize],
    args: &SearchArgs,
    progress: &Progress,
) -> Totals {
    let mut t = Totals {
        recall: vec![0.0; ks.len()],
        complete: vec![0.0; ks.len()],
        tokens: vec![0.0; ks.len()],
        ..Totals::default()
    };
    let mut shown = 0;
    for (qi, q) in queries.iter().enumerate() {
        progress.inc(1);
        let hits = index
            .query(strategy, &q.text, args.dump_depth.max(100), &|_| true)
            .unwrap_or_else(|_| {
                t.errors += 1;
                Vec::new()
            });
        let ranked: Vec<String> = hits.iter().take(100).map(|h| h.id.clone()).collect();
        let s = eval::score(&ranked, &q.relevant, ks);
        for (i, (r, c)) in s.recall.iter().zip(&s.complete).enumerate() {
            t.recall[i] += r;
            t.complete[i] += c;
        }
        t.ndcg10 += s.ndcg10;
        t.mrr += s.mrr;
        t.hit1 += s.hit1;
        let hit1 = s.hit1 > 0.0;
        if qi < args.token_queries {
            t.token_queries += 1;
            for (i, &k) in ks.iter().enumerate() {
                let shown_hits = &ranked[..k.min(ranked.len())];
                let text = render_summary(view, &q.text, strategy, shown_hits);
                t.tokens[i] += count_tokens(&text) as f64;
            }
        }
        if shown < args.misses && !hit1 {
            shown += 1;
            eprintln!(
                "[{strategy}] {}\n  want {:?}\n  got  {:?}",
                q.text,
                q.relevant,
                &ranked[..ranked.len().min(5)]
            );
        }
        let kept = args.dump_depth.max(10);
        t.per_query.push((s, hits.into_iter().take(kept).collect()));
    }
    t
}

/// One JSON line per query: its id, figures and top 10.
fn per_query_rows(
    strategy: Strategy,
    queries: &[Query],
    ks: &[usize],
    scores: &[(QueryScores, Vec<Hit>)],
    dump_depth: usize,
) -> Vec<Value> {
    let per_k = |v: &[f64]| -> BTreeMap<String, f64> {
        ks.iter().zip(v).map(|(k, x)| (k.to_string(), *x)).collect()
    };
    queries
        .iter()
        .zip(scores)
        .map(|(q, (s, hits))| {
            let top: Vec<&str> = hits.iter().take(10).map(|h| h.id.as_str()).collect();
            let mut row = json!({
                "strategy": strategy,
                "id": q.id,
                "query": q.text,
                "relevant": q.relevant,
                "ndcg@10": s.ndcg10,
                "mrr": s.mrr,
                "hit@1": s.hit1,
                "recall": per_k(&s.recall),
                "completeness": per_k(&s.complete),
                "top": top,
            });
            if dump_depth > 0 {
                row["hits"] = hits
                    .iter()
                    .take(dump_depth)
                    .map(|h| json!([h.id, h.score]))
                    .collect();
            }
            row
        })
        .collect()
}

/// Each figure's difference from the baseline's per-query rows, paired by
/// strategy and query id, with a bootstrap 95% interval.
fn print_differences(path: &Path, rows: &[Value], ks: &[usize]) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let key = |v: &Value| (v["strategy"].to_string(), v["id"].to_string());
    let mut before = HashMap::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: Value =
            serde_json::from_str(line).with_context(|| format!("{}:{}", path.display(), n + 1))?;
        before.insert(key(&v), v);
    }
    let mut figures = vec![
        ("nDCG@10".to_string(), "/ndcg@10".to_string()),
        ("Hit@1".to_string(), "/hit@1".to_string()),
        ("MRR".to_string(), "/mrr".to_string()),
    ];
    figures.extend(
        ks.iter()
            .map(|k| (format!("C@{k}"), format!("/completeness/{k}"))),
    );
    let mut strategies: Vec<&Value> = rows.iter().map(|r| &r["strategy"]).collect();
    strategies.dedup();
    println!("against {} (paired bootstrap, 95%):", path.display());
    for strategy in strategies {
        let pairs: Vec<(&Value, &Value)> = rows
            .iter()
            .filter(|r| &r["strategy"] == strategy)
            .filter_map(|r| before.get(&key(r)).map(|b| (b, r)))
            .collect();
        if pairs.is_empty() {
            continue;
        }
        let mut line = format!(
            "{:<10} {} queries",
            strategy.as_str().unwrap_or_default(),
            pairs.len()
        );
        for (name, pointer) in &figures {
            let get = |v: &Value| v.pointer(pointer).and_then(Value::as_f64).unwrap_or(0.0);
            let (b, a): (Vec<f64>, Vec<f64>) = pairs.iter().map(|(b, a)| (get(b), get(a))).unzip();
            let d = Bootstrap::default().paired(&b, &a);
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
            line += &format!(
                "; {name} {:.3} -> {:.3}, {:+.3} [{:+.3}, {:+.3}]",
                mean(&b),
                mean(&a),
                d.mean,
                d.low,
                d.high
            );
        }
        println!("{line}");
    }
    Ok(())
}

/// p50 and p99 of one `query` call with limit `limit`, seeing what
/// `filter` lets through.
fn latency(
    index: &SearchIndex,
    strategy: Strategy,
    queries: &[Query],
    limit: usize,
    samples: usize,
    filter: &dyn Fn(&ToolDoc) -> bool,
) -> (Duration, Duration) {
    let mut times: Vec<Duration> = (0..samples.max(1))
        .map(|i| {
            let q = &queries[i % queries.len()].text;
            let started = Instant::now();
            let _ = std::hint::black_box(index.query(strategy, q, limit, filter));
            started.elapsed()
        })
        .collect();
    times.sort_unstable();
    let at = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize];
    (at(0.5), at(0.99))
}

/// A policy that shows about one server in fifty (by a hash of its name).
fn selective(doc: &ToolDoc) -> bool {
    let h = doc.server.bytes().fold(2166136261u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(16777619)
    });
    h % 50 == 0
}

fn print_table(rows: &[(Strategy, Value)], ks: &[usize]) {
    let mut header = format!("{:<10}", "strategy");
    for k in ks {
        header += &format!(" {:>6}", format!("R@{k}"));
    }
    for k in ks {
        header += &format!(" {:>6}", format!("C@{k}"));
    }
    header += &format!(
        " {:>7} {:>6} {:>6} {:>8} {:>8}",
        "nDCG@10", "MRR", "Hit@1", "p50 ms", "p99 ms"
    );
    for k in ks {
        header += &format!(" {:>6}", format!("tok@{k}"));
    }
    println!("{header}");
    for (strategy, v) in rows {
        let mut line = format!("{:<10}", strategy.to_string());
        for key in ["recall", "completeness"] {
            for k in ks {
                line += &format!(" {:>6.3}", v[key][k.to_string()].as_f64().unwrap_or(0.0));
            }
        }
        line += &format!(
            " {:>7.3} {:>6.3} {:>6.3} {:>8.3} {:>8.3}",
            v["ndcg@10"].as_f64().unwrap_or(0.0),
            v["mrr"].as_f64().unwrap_or(0.0),
            v["hit@1"].as_f64().unwrap_or(0.0),
            v["p50_ms"].as_f64().unwrap_or(0.0),
            v["p99_ms"].as_f64().unwrap_or(0.0),
        );
        for k in ks {
            line += &format!(
                " {:>6.0}",
                v["tokens"][k.to_string()].as_f64().unwrap_or(0.0)
            );
        }
        if v["errors"].as_u64().unwrap_or(0) > 0 {
            line += &format!("  ({} queries failed)", v["errors"]);
        }
        println!("{line}");
    }
}

fn load_queries(path: &Path, qualified: &HashMap<&str, String>) -> anyhow::Result<Vec<Query>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut queries = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value =
            serde_json::from_str(line).with_context(|| format!("{}:{}", path.display(), n + 1))?;
        let mut relevant: Vec<String> = v["relevant"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|id| qualified.get(id.as_str()?).cloned())
            .collect();
        relevant.sort();
        relevant.dedup();
        if let (Some(text), false) = (v["query"].as_str(), relevant.is_empty()) {
            let id = match &v["id"] {
                Value::String(s) => s.clone(),
                Value::Null => (n + 1).to_string(),
                other => other.to_string(),
            };
            queries.push(Query {
                id,
                text: text.to_string(),
                relevant,
            });
        }
    }
    Ok(queries)
}

/// The document the gateway indexes for a tool (as `manifold-server`'s
/// discovery builds it).
fn tool_doc(view: &CatalogView, tool: &CatalogTool) -> ToolDoc {
    let schema = Value::Object((*tool.definition.input_schema).clone());
    ToolDoc {
        id: tool.qualified.clone(),
        server: tool.server.clone(),
        server_description: view
            .server(&tool.server)
            .map(|s| s.description.clone())
            .unwrap_or_default(),
        name: tool.upstream_name.clone(),
        title: tool.definition.title.clone(),
        description: tool.description().to_string(),
        params: ToolDoc::params_from_schema(&schema),
    }
}

/// What `search_tools` returns with `detail=summary`: tools grouped by
/// server in rank order, each with its name and the first sentence of its
/// description (as `manifold-server`'s discovery renders it).
fn render_summary(view: &CatalogView, query: &str, strategy: Strategy, ids: &[String]) -> String {
    let mut groups: Vec<(String, Vec<Value>)> = Vec::new();
    for id in ids {
        let Some(tool) = view.tool(id) else { continue };
        let entry = json!({"name": tool.qualified, "description": one_line(tool.description())});
        match groups.iter_mut().find(|(s, _)| *s == tool.server) {
            Some((_, tools)) => tools.push(entry),
            None => groups.push((tool.server.clone(), vec![entry])),
        }
    }
    let servers: Vec<Value> = groups
        .into_iter()
        .map(|(name, tools)| {
            let description = view.server(&name).map_or("", |s| s.description.as_str());
            json!({"server": name, "description": description, "tools": tools})
        })
        .collect();
    json!({"query": query, "strategy": strategy, "count": ids.len(), "servers": servers})
        .to_string()
}

/// Remembers query vectors while quality is measured, so each strategy does
/// not embed the same 10,000 queries again; switched off for latency.
struct QueryMemo {
    inner: Arc<CachedEmbedder>,
    memoize: AtomicBool,
    seen: Mutex<HashMap<String, Vec<f32>>>,
}

impl QueryMemo {
    fn new(inner: Arc<CachedEmbedder>) -> Self {
        Self {
            inner,
            memoize: AtomicBool::new(false),
            seen: Mutex::new(HashMap::new()),
        }
    }
}

impl Embedder for QueryMemo {
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.inner.embed(texts)
    }

    fn embed_query(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        if !self.memoize.load(Ordering::Relaxed) {
            return self.inner.embed_query(text);
        }
        if let Some(v) = self.seen.lock().expect("memo lock").get(text) {
            return Ok(v.clone());
        }
        let v = self.inner.embed_query(text)?;
        self.seen
            .lock()
            .expect("memo lock")
            .insert(text.to_string(), v.clone());
        Ok(v)
    }

    fn embed_queries(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if !self.memoize.load(Ordering::Relaxed) {
            return self.inner.embed_queries(texts);
        }
        texts.iter().map(|t| self.embed_query(t)).collect()
    }
}

struct Reindex {
    server: String,
    tools: usize,
    total_ms: f64,
    bm25_ms: f64,
    vectors_ms: f64,
    embed_ms: f64,
}

/// Times what the gateway does when one server's tools change: a new BM25F
/// index over the whole catalog (only the changed tools analysed), then its
/// vectors, the changed tools embedded and the rest from the previous index.
/// The server is one of median size.
fn reindex_one_server(
    docs: &[ToolDoc],
    bm25: &Bm25Params,
    hybrid: HybridParams,
    cached: &Arc<CachedEmbedder>,
    bm25_cache: &mut Bm25Cache,
    previous: &SearchIndex,
) -> anyhow::Result<Reindex> {
    let mut sizes: BTreeMap<&str, usize> = BTreeMap::new();
    for d in docs {
        *sizes.entry(d.server.as_str()).or_default() += 1;
    }
    let mut by_size: Vec<(usize, &str)> = sizes.iter().map(|(s, n)| (*n, *s)).collect();
    by_size.sort_unstable();
    let (tools, server) = by_size[by_size.len() / 2];
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let (mut total, mut embed) = (Vec::new(), Vec::new());
    let (mut bm25_part, mut vectors_part) = (Vec::new(), Vec::new());
    for round in 0..5 {
        let mut changed = docs.to_vec();
        let mut texts = Vec::new();
        for d in changed.iter_mut().filter(|d| d.server == server) {
            d.description
                .push_str(&format!(" (revision {round}, {stamp})"));
            texts.push(manifold_search::embedding_text(d));
        }
        let started = Instant::now();
        let index = SearchIndex::build_cached(changed, bm25, bm25_cache).with_hybrid_params(hybrid);
        let indexed = started.elapsed();
        index
            .with_embeddings_from(Arc::clone(cached) as Arc<dyn Embedder>, previous)
            .map_err(anyhow::Error::msg)?;
        let done = started.elapsed();
        total.push(done.as_secs_f64() * 1e3);
        bm25_part.push(indexed.as_secs_f64() * 1e3);
        vectors_part.push((done - indexed).as_secs_f64() * 1e3);
        // The same texts again through the model alone: the embedding share.
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let started = Instant::now();
        cached.inner().embed(&refs).map_err(anyhow::Error::msg)?;
        embed.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(Reindex {
        server: server.to_string(),
        tools,
        total_ms: median(total),
        bm25_ms: median(bm25_part),
        vectors_ms: median(vectors_part),
        embed_ms: median(embed),
    })
}

fn set_param(bm25: &mut Bm25Params, hybrid: &mut HybridParams, kv: &str) -> anyhow::Result<()> {
    let (key, value) = kv.split_once('=').context("--set takes KEY=VALUE")?;
    let number = || value.parse::<f32>().with_context(|| format!("--set {kv}"));
    match key {
        "bm25.k1" => bm25.k1 = number()?,
        "hybrid.fusion" => {
            hybrid.fusion = match value {
                "rrf" => Fusion::Rrf { k: 60.0 },
                "weighted" => Fusion::Weighted,
                _ => bail!("hybrid.fusion is rrf or weighted"),
            }
        }
        "hybrid.k" => hybrid.fusion = Fusion::Rrf { k: number()? },
        "hybrid.w" => hybrid.bm25_weight = number()?,
        "hybrid.depth" => hybrid.depth = number()? as usize,
        "hybrid.boost" => hybrid.server_boost = number()?,
        "hybrid.feedback" => hybrid.feedback = number()?,
        "hybrid.feedback_docs" => hybrid.feedback_docs = number()? as usize,
        "hybrid.clauses" => hybrid.clause_weight = number()?,
        "hybrid.clause_embedding" => hybrid.clause_embedding = number()? != 0.0,
        _ => {
            let (field, knob) = key
                .strip_prefix("bm25.")
                .and_then(|k| k.split_once('.'))
                .with_context(|| format!("unknown parameter {key:?}"))?;
            let field = match field {
                "name" => &mut bm25.name,
                "server" => &mut bm25.server,
                "sdesc" => &mut bm25.server_description,
                "desc" => &mut bm25.description,
                "params" => &mut bm25.params,
                _ => bail!("unknown parameter {key:?}"),
            };
            match knob {
                "w" => field.weight = number()?,
                "b" => field.b = number()?,
                _ => bail!("unknown parameter {key:?}"),
            }
        }
    }
    Ok(())
}

/// Attaches a bar to an embedder for the texts it has to embed: shown only
/// when something is missing from the cache (a first run), and finished when
/// the last slice is done.
fn embedding_bar(embedder: &manifold_embed::CachedEmbedder, label: &str) {
    let label = label.to_string();
    let current: Mutex<Option<Arc<Progress>>> = Mutex::new(None);
    embedder.on_progress(Some(Arc::new(move |done: usize, total: usize| {
        let mut current = current.lock().unwrap_or_else(|p| p.into_inner());
        if done == 0 {
            *current = Some(Progress::new(&label, total as u64));
            return;
        }
        if let Some(progress) = current.as_ref() {
            progress.set(done as u64);
            if done >= total {
                progress.finish();
                *current = None;
            }
        }
    })));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hits(n: usize) -> Vec<Hit> {
        (0..n)
            .map(|i| Hit {
                id: format!("s__t{i}"),
                score: 1.0 / (i as f32 + 1.0),
            })
            .collect()
    }

    #[test]
    fn a_dump_keeps_the_scored_hits_a_fusion_study_needs() {
        let queries = [Query {
            id: "q1".into(),
            text: "read a file".into(),
            relevant: vec!["s__t3".into()],
        }];
        let ranked: Vec<String> = hits(30).into_iter().map(|h| h.id).collect();
        let scores = vec![(eval::score(&ranked, &queries[0].relevant, &[10]), hits(30))];

        let plain = per_query_rows(Strategy::Bm25, &queries, &[10], &scores, 0);
        assert_eq!(plain[0]["top"].as_array().map(Vec::len), Some(10));
        assert!(plain[0].get("hits").is_none());

        let dumped = per_query_rows(Strategy::Bm25, &queries, &[10], &scores, 25);
        let kept = dumped[0]["hits"].as_array().expect("hits");
        assert_eq!(kept.len(), 25);
        assert_eq!(kept[3], json!(["s__t3", 0.25]));
        assert_eq!(dumped[0]["top"], plain[0]["top"]);
    }
}
