//! `manifold`: one MCP endpoint in front of many MCP servers.

mod bench;
mod config;
mod eval;
mod gateway;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "manifold",
    version,
    about = "One MCP endpoint in front of many MCP servers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve Streamable HTTP at /mcp.
    Serve {
        #[arg(long)]
        config: PathBuf,
        /// Overrides gateway.listen.
        #[arg(long)]
        listen: Option<String>,
    },
    /// Serve one client over stdin/stdout (for desktop clients that spawn servers).
    Stdio {
        #[arg(long)]
        config: PathBuf,
        /// Identifies the caller; read from the environment, never from argv.
        #[arg(long, env = "MANIFOLD_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Inspect the catalog.
    Catalog {
        #[command(subcommand)]
        command: CatalogCommand,
    },
    /// Benchmarks (not timed tests): search latency and call overhead.
    Bench {
        #[command(subcommand)]
        command: bench::BenchCommand,
    },
    /// Evaluation on labelled data: search quality, latency and result size.
    Eval {
        #[command(subcommand)]
        command: eval::EvalCommand,
    },
}

#[derive(Subcommand)]
enum CatalogCommand {
    /// Servers, tool counts, definition tokens and the mode chosen.
    Stats {
        #[arg(long)]
        config: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MANIFOLD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn"));
    // Logs go to stderr: stdout belongs to the MCP stream in stdio mode.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_logging();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { config, listen } => gateway::serve(&config, listen).await,
        Command::Stdio { config, token } => gateway::stdio(&config, token).await,
        Command::Catalog {
            command: CatalogCommand::Stats { config, json },
        } => gateway::catalog_stats(&config, json).await,
        Command::Bench { command } => bench::run(command).await,
        Command::Eval { command } => tokio::task::block_in_place(|| eval::run(command)),
    }
}
