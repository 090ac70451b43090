//! Governance admin commands: tokens, policies, tool quarantine, approvals
//! and audit, straight against the store a config names.

mod approvals;
mod audit;
mod policy;
mod tokens;
mod tools;

use std::{path::PathBuf, time::Duration};

use anyhow::{Context, bail};
use clap::Args;
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

/// `30d`, `12h`, `90m`, `45s`, or bare seconds. Zero is refused: every use
/// (expiry, rate window, "since") needs a positive span.
pub fn parse_duration(text: &str) -> anyhow::Result<Duration> {
    let text = text.trim();
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let scale: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 60 * 60,
        "d" => 24 * 60 * 60,
        _ => bail!("invalid duration '{text}' (expected e.g. 30d, 12h, 90m, 45s or seconds)"),
    };
    let n: u64 = digits
        .parse()
        .with_context(|| format!("invalid duration '{text}' (expected e.g. 30d, 12h, 90m, 45s)"))?;
    let secs = n
        .checked_mul(scale)
        .with_context(|| format!("duration '{text}' is too long"))?;
    if secs == 0 {
        bail!("duration '{text}' must be greater than zero");
    }
    Ok(Duration::from_secs(secs))
}

/// Unix milliseconds as RFC 3339 UTC, e.g. `2026-11-30T06:56:10Z`.
pub fn format_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant), valid for the proleptic Gregorian calendar.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
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
