//! Benchmarks. They report figures side by side in one run; they assert nothing.

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use clap::Subcommand;
use manifold_catalog::{CatalogView, Principal, ToolCatalog, count_tokens, jsonl};
use manifold_search::Strategy;
use manifold_server::{Detail, Discovery};
use manifold_upstream::{Upstream, UpstreamConfig};
use rmcp::{
    ServiceExt,
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde_json::json;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// `search_tools` latency (search plus rendering) at several catalog sizes.
    Search {
        /// JSONL catalogs, comma-separated; tools are taken in file order.
        #[arg(long, value_delimiter = ',', required = true)]
        catalog: Vec<PathBuf>,
        /// Catalog sizes to measure (tools); "all" for every tool.
        #[arg(long, value_delimiter = ',', default_value = "1000,all")]
        sizes: Vec<String>,
        /// Labelled queries (JSONL with a "query" field).
        #[arg(long)]
        queries: PathBuf,
        #[arg(long, default_value_t = 3000)]
        iterations: usize,
        #[arg(long, default_value_t = 8)]
        limit: usize,
    },
    /// `tools/call` through a `manifold serve` process against the same
    /// upstream process called directly: latency, throughput, gateway CPU.
    Call(crate::bench_call::CallArgs),
    /// Statements, peak memory and time of governed listings on a seed-001-shaped database.
    Listing(crate::bench_listing::ListingArgs),
    /// Code mode: cold runs in process and through the isolated worker, the
    /// bridge's per-call cost, and many scripts at once.
    Code(crate::bench_code::CodeArgs),
    /// Seed 000's task with direct calls and with code mode: tokens and wall time.
    CodeTask(crate::bench_code::TaskArgs),
    /// Load on a real `manifold serve` over loopback: calls below admission
    /// capacity (against the upstream directly too), listings above it, and
    /// an optional soak with the gateway's RSS sampled.
    Load(crate::bench_load::LoadArgs),
}

pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Search {
            catalog,
            sizes,
            queries,
            iterations,
            limit,
        } => bench_search(&catalog, &sizes, &queries, iterations, limit),
        BenchCommand::Call(args) => crate::bench_call::run(args).await,
        BenchCommand::Listing(args) => crate::bench_listing::run(args).await,
        BenchCommand::Code(args) => crate::bench_code::run(args).await,
        BenchCommand::CodeTask(args) => crate::bench_code::run_task(args).await,
        BenchCommand::Load(args) => crate::bench_load::run(args).await,
    }
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

pub(crate) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

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

fn bench_search(
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
        let progress = manifold::progress::Progress::new(&format!("{n} tools"), iterations as u64);
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

/// Start a fixture upstream over Streamable HTTP; returns the child and its URL.
pub(crate) async fn start_http_fixture(
    dir: &std::path::Path,
) -> anyhow::Result<(tokio::process::Child, String)> {
    start_http_fixture_with(dir, &[]).await
}

/// [`start_http_fixture`] with extra `catalog` flags (delays, cache scope).
pub(crate) async fn start_http_fixture_with(
    dir: &std::path::Path,
    flags: &[&str],
) -> anyhow::Result<(tokio::process::Child, String)> {
    use tokio::io::AsyncBufReadExt;
    let catalog = dir.join("bench.jsonl");
    std::fs::write(
        &catalog,
        json!({
            "id": "bench::echo", "server": "bench", "name": "echo",
            "description": "Echo the message back.",
            "input_schema": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}
        })
        .to_string()
            + "\n",
    )?;
    let exe = std::env::current_exe()?.with_file_name("manifold-fixture");
    let mut child = tokio::process::Command::new(&exe)
        .args(["--http", "127.0.0.1:0", "catalog", "--file"])
        .arg(&catalog)
        .args(["--server", "bench"])
        .args(flags)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", exe.display()))?;
    let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("piped")).lines();
    let url = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(i) = line.find("listening on ") {
                return Ok::<_, anyhow::Error>(
                    line[i + "listening on ".len()..].trim().to_string(),
                );
            }
        }
        bail!("fixture exited before listening")
    })
    .await
    .context("fixture did not start")??;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, url))
}

/// `manifold serve` on `config` at a free loopback port; its URL.
pub(crate) async fn start_gateway(
    config: &std::path::Path,
) -> anyhow::Result<(tokio::process::Child, String)> {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .env("MANIFOLD_LOG", "warn,manifold=info")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("piped")).lines();
    let url = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(rest) = line.strip_prefix("manifold listening on ") {
                return Ok::<_, anyhow::Error>(rest.trim().to_string());
            }
        }
        bail!("the gateway exited before listening")
    })
    .await
    .context("the gateway did not start")??;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, url))
}

/// The fixture at `upstream_url` as the only upstream of a catalog, and
/// governance as served: a SQLite store in `dir`, policies read and an
/// activity row written per call.
pub(crate) async fn governed_catalog(
    dir: &std::path::Path,
    upstream_url: &str,
) -> anyhow::Result<(Arc<ToolCatalog>, Arc<manifold_broker::Governance>)> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let upstream = Upstream::new(
        UpstreamConfig::http("bench", upstream_url),
        tx,
        Default::default(),
    );
    let catalog = ToolCatalog::new(vec![upstream], true);
    catalog.spawn_event_loop(rx, |_| {});
    catalog.connect_enabled().await;
    catalog.view(&Principal::anonymous()).await;
    let store = manifold_store::Store::open_data_dir(&dir.join("data")).await?;
    let governance = manifold_broker::Governance::new(store, Default::default());
    Ok((catalog, governance))
}

pub(crate) async fn http_client(
    url: &str,
) -> anyhow::Result<rmcp::service::RunningService<rmcp::RoleClient, ()>> {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url.to_string()),
    );
    Ok(().serve(transport).await?)
}
