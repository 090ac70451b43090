//! `manifold-bench`: Manifold's benchmarks and search evaluation. They report
//! figures side by side in one run and assert nothing (the load test in
//! `crates/manifold/tests/e2e/load.rs` asserts on `load`'s JSON). The
//! gateway and fixture processes they drive are the `manifold` and
//! `manifold-fixture` binaries beside this one.

mod alloc;
mod call;
mod code;
mod eval;
mod floor;
mod listing;
mod load;
mod processes;
mod search;
mod stats;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "manifold-bench",
    version,
    about = "Benchmarks and search evaluation for Manifold (figures, not timed tests)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
    Call(call::CallArgs),
    /// Statements, peak memory and time of governed listings on a seed-001-shaped database.
    Listing(listing::ListingArgs),
    /// Code mode: cold runs in process and through the isolated worker, the
    /// bridge's per-call cost, and many scripts at once.
    Code(code::CodeArgs),
    /// Seed 000's task with direct calls and with code mode: tokens and wall time.
    CodeTask(code::TaskArgs),
    /// Load on a real `manifold serve` over loopback: calls below admission
    /// capacity (against the upstream directly too), listings above it, and
    /// an optional soak with the gateway's RSS sampled.
    Load(load::LoadArgs),
    /// Evaluation on labelled data: search quality, latency and result size.
    Eval {
        #[command(subcommand)]
        command: eval::EvalCommand,
    },
}

fn main() -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MANIFOLD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(run(Cli::parse().command));
    // A blocking task still running must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Search {
            catalog,
            sizes,
            queries,
            iterations,
            limit,
        } => search::run(&catalog, &sizes, &queries, iterations, limit),
        Command::Call(args) => call::run(args).await,
        Command::Listing(args) => listing::run(args).await,
        Command::Code(args) => code::run(args).await,
        Command::CodeTask(args) => code::run_task(args).await,
        Command::Load(args) => load::run(args).await,
        Command::Eval { command } => tokio::task::block_in_place(|| eval::run(command)),
    }
}
