//! `manifold`: one MCP endpoint in front of many MCP servers.

mod doctor;
mod gateway;
mod oauth;
mod reload;
mod sandbox;
mod settings;
mod telemetry;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use manifold_cli::servers;
use manifold_config::{Config, LogFormat, TelemetrySection};

/// The process allocator is mimalloc: glibc's malloc and free were about a
/// seventh of the gateway's CPU under 16 callers (`manifold-bench call`).
/// It is built with `no_thp`: mimalloc otherwise madvises its arenas for
/// transparent huge pages, and with that a burst of restarts reached the
/// 256 MiB bound of docs/configuration.md (242–256 MiB), where glibc stayed
/// near 130 MiB.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "manifold",
    version,
    about = "One MCP endpoint in front of many MCP servers"
)]
struct Cli {
    /// Log lines as text or JSON objects; overrides `[log] format`.
    #[arg(long, global = true, env = "MANIFOLD_LOG_FORMAT", value_enum)]
    log_format: Option<LogFormat>,
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
    /// Print the caller's visible tools as a ready-to-send `tools` array for
    /// the Anthropic Messages API or the OpenAI Responses API (deferred
    /// loading, a tool search entry, provider-safe names).
    Export {
        #[arg(long)]
        config: PathBuf,
        /// anthropic or openai.
        #[arg(long)]
        format: manifold_export::Provider,
        /// A gateway token naming the caller; also read from MANIFOLD_TOKEN.
        #[arg(long, env = "MANIFOLD_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Inspect the catalog.
    Catalog {
        #[command(subcommand)]
        command: CatalogCommand,
    },
    /// Gateway tokens: create, list, revoke, groups.
    Token {
        #[command(subcommand)]
        command: manifold_cli::TokenCommand,
    },
    /// Policy rules.
    Policy {
        #[command(subcommand)]
        command: manifold_cli::PolicyCommand,
    },
    /// Tool classifications and quarantine.
    Tools {
        #[command(subcommand)]
        command: manifold_cli::ToolsCommand,
    },
    /// Calls waiting for an operator's decision.
    Approvals {
        #[command(subcommand)]
        command: manifold_cli::ApprovalsCommand,
    },
    /// The audit trails, as JSON lines.
    Audit {
        #[command(subcommand)]
        command: manifold_cli::AuditCommand,
    },
    /// Check the code-mode sandbox: start a worker and report which
    /// isolation layers are active and what its probes found.
    Doctor {
        #[arg(long)]
        config: Option<PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Write a commented starter config that loads and serves as it is.
    Init {
        #[arg(long, default_value = "manifold.toml")]
        config: PathBuf,
    },
    /// Bring servers in from Claude Desktop, Cursor or VS Code (or a file):
    /// prints [[servers]] TOML, or with --write adds them to the config.
    Import {
        /// claude-desktop, cursor, vscode, or a path to an mcp.json.
        #[arg(long)]
        from: String,
        #[arg(long, default_value = "manifold.toml")]
        config: PathBuf,
        /// Add them to --config (comments and order kept) instead of printing.
        #[arg(long)]
        write: bool,
    },
    /// The config's servers: list, add, remove, enable, disable (the
    /// operator's switch for everyone; a running gateway reloads the file).
    Servers {
        #[command(subcommand)]
        command: servers::ServersCommand,
    },
    /// OAuth sign-in of the gateway to `auth = "oauth"` servers.
    Auth {
        #[command(subcommand)]
        command: oauth::AuthCommand,
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

/// `--log-format`, else the config's `[log] format`, else text; and the
/// config's `[telemetry]` (the gateway commands only). Read leniently here:
/// a broken config is reported once logging is up.
fn log_settings(cli: &Cli) -> (LogFormat, TelemetrySection) {
    let text = match &cli.command {
        Command::Serve { config, .. } | Command::Stdio { config, .. } => {
            std::fs::read_to_string(config).ok()
        }
        _ => None,
    };
    let format = cli
        .log_format
        .or_else(|| text.as_deref().and_then(Config::log_format_of))
        .unwrap_or_default();
    let telemetry = text
        .as_deref()
        .map(Config::telemetry_of)
        .unwrap_or_default();
    (format, telemetry)
}

/// The hidden subcommand the gateway starts sandbox workers with.
pub const SANDBOX_WORKER: &str = "sandbox-worker";

fn main() -> anyhow::Result<()> {
    // A sandbox worker isolates itself before anything else runs: some
    // layers need a single-threaded process, so no runtime, no logging.
    let mut args = std::env::args();
    if args.nth(1).as_deref() == Some(SANDBOX_WORKER) {
        std::process::exit(sandbox::worker_main(args.next()));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(run());
    // A blocking task still running (a stdin read, a sandbox pipe) must not
    // hold the exit after a drained shutdown.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let (format, telemetry) = log_settings(&cli);
    let traces = telemetry::init_logging(format, &telemetry);
    let result = command(cli).await;
    if let Some(traces) = traces {
        // The last spans go out before the process exits.
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    result
}

async fn command(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve { config, listen } => gateway::serve(&config, listen).await,
        Command::Stdio { config, token } => gateway::stdio(&config, token).await,
        Command::Export {
            config,
            format,
            token,
        } => gateway::export(&config, format, token).await,
        Command::Catalog {
            command: CatalogCommand::Stats { config, json },
        } => gateway::catalog_stats(&config, json).await,
        Command::Token { command } => manifold_cli::run_token(command).await,
        Command::Auth { command } => oauth::run(command).await,
        Command::Policy { command } => manifold_cli::run_policy(command).await,
        Command::Tools { command } => manifold_cli::run_tools(command).await,
        Command::Approvals { command } => manifold_cli::run_approvals(command).await,
        Command::Audit { command } => manifold_cli::run_audit(command).await,
        Command::Doctor { config, json } => doctor::run(&config, json).await,
        Command::Init { config } => servers::init(&config),
        Command::Import {
            from,
            config,
            write,
        } => servers::import(&from, &config, write),
        Command::Servers { command } => servers::run(command),
    }
}
