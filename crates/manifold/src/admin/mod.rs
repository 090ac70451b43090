//! Governance admin commands: tokens, policies, tool quarantine, approvals
//! and audit, straight against the store a config names.

mod approvals;
mod audit;
mod policy;
mod tokens;
mod tools;

use std::{path::PathBuf, time::Duration};

use clap::Args;
use manifold_server::admin::ops;
use manifold_store::Store;

pub use approvals::{ApprovalsCommand, run_approvals};
pub use audit::{AuditCommand, run_audit};
pub use policy::{PolicyCommand, run_policy};
pub use tokens::{TokenCommand, run_token};
pub use tools::{ToolsCommand, run_tools};

use crate::config::Config;

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

/// `30d`, `12h`, `90m`, `45s`, or bare seconds; the admin API's parser.
pub fn parse_duration(text: &str) -> anyhow::Result<Duration> {
    Ok(ops::parse_duration(text)?)
}

pub use manifold_server::admin::ops::format_ms;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("30d").unwrap(),
            Duration::from_secs(30 * 86_400)
        );
        assert_eq!(
            parse_duration("12h").unwrap(),
            Duration::from_secs(12 * 3600)
        );
        assert_eq!(parse_duration("90m").unwrap(), Duration::from_secs(90 * 60));
        assert_eq!(parse_duration("45s").unwrap(), Duration::from_secs(45));
        assert_eq!(parse_duration("60").unwrap(), Duration::from_secs(60));
        for bad in [
            "",
            "0",
            "0s",
            "h",
            "5w",
            "-5s",
            "1.5h",
            "5 m",
            "99999999999999999999d",
        ] {
            let err = parse_duration(bad).unwrap_err().to_string();
            assert!(err.contains("duration"), "{bad}: {err}");
        }
    }

    #[test]
    fn formats_utc() {
        assert_eq!(format_ms(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_ms(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(format_ms(1_795_935_370_999), "2026-11-29T06:56:10Z");
    }
}
