//! The operator's commands: gateway tokens, policies, tool quarantine,
//! approvals and the audit (straight against the store a config names,
//! through `manifold-operations`), and the config's servers (`init`,
//! `import`, `servers …`, through `manifold-config`). The `manifold` binary
//! offers them in its command tree; they never link the HTTP server.

mod approvals;
mod audit;
mod policy;
pub mod progress;
pub mod servers;
mod tokens;
mod tools;

use std::path::PathBuf;

use clap::Args;
use manifold_config::Config;
use manifold_store::Store;

pub use approvals::{ApprovalsCommand, run_approvals};
pub use audit::{AuditCommand, run_audit};
pub use policy::{PolicyCommand, run_policy};
pub use tokens::{TokenCommand, run_token};
pub use tools::{ToolsCommand, run_tools};

/// The `--config` every admin command takes.
#[derive(Args, Debug)]
pub struct ConfigArg {
    /// The gateway config; its store is the one administered.
    #[arg(long)]
    config: PathBuf,
}

impl ConfigArg {
    async fn open(&self) -> anyhow::Result<Store> {
        Config::load(&self.config)?.open_store().await
    }
}

/// Left-aligned columns, two spaces apart.
fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        println!("{}", out.trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// A list joined by commas, or `-` when empty.
fn joined<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> String {
    let parts: Vec<String> = items.into_iter().map(|s| s.as_ref().to_string()).collect();
    if parts.is_empty() {
        "-".to_string()
    } else {
        parts.join(",")
    }
}

fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}
