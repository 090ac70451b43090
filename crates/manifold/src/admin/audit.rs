//! `manifold audit ...`: the audit trails as JSON lines.

use anyhow::Context;
use clap::{Subcommand, ValueEnum};
use manifold_store::{AuditKind, now_ms};
use serde_json::Value;

use super::{ConfigArg, parse_duration};

#[derive(Subcommand, Debug)]
pub enum AuditCommand {
    /// The last rows, oldest first.
    Tail {
        #[command(flatten)]
        config: ConfigArg,
        /// One trail; default all three, merged by time.
        #[arg(long, value_enum)]
        kind: Option<KindArg>,
        #[arg(short = 'n', default_value_t = 20)]
        n: usize,
    },
    /// Every row since a time, oldest first.
    Export {
        #[command(flatten)]
        config: ConfigArg,
        #[arg(long, value_enum)]
        kind: Option<KindArg>,
        /// A span back from now (`1h`, `7d`, `90m`) or unix milliseconds.
        /// Default: everything.
        #[arg(long)]
        since: Option<String>,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum KindArg {
    Discovery,
    Access,
    Activity,
}

impl KindArg {
    fn kind(self) -> AuditKind {
        match self {
            KindArg::Discovery => AuditKind::Discovery,
            KindArg::Access => AuditKind::Access,
            KindArg::Activity => AuditKind::Activity,
        }
    }
}

fn kinds(kind: Option<KindArg>) -> Vec<AuditKind> {
    kind.map_or_else(|| AuditKind::ALL.to_vec(), |k| vec![k.kind()])
}

pub async fn run_audit(command: AuditCommand) -> anyhow::Result<()> {
    let rows = match command {
        AuditCommand::Tail { config, kind, n } => {
            let store = config.open().await?;
            let mut rows = Vec::new();
            for kind in kinds(kind) {
                rows.extend(
                    store
                        .audit_tail(kind, n)
                        .await
                        .with_context(|| format!("cannot read the {kind} audit"))?,
                );
            }
            sort(&mut rows);
            // Each trail gave its last n; the merged tail is the last n of those.
            let skip = rows.len().saturating_sub(n);
            rows.split_off(skip)
        }
        AuditCommand::Export {
            config,
            kind,
            since,
        } => {
            let since = match since.as_deref() {
                None => 0,
                Some(ms) if !ms.is_empty() && ms.bytes().all(|b| b.is_ascii_digit()) => ms
                    .parse()
                    .with_context(|| format!("invalid --since '{ms}'"))?,
                Some(span) => {
                    let span = parse_duration(span).context("invalid --since")?;
                    now_ms().saturating_sub(i64::try_from(span.as_millis()).unwrap_or(i64::MAX))
                }
            };
            let store = config.open().await?;
            let mut rows = Vec::new();
            for kind in kinds(kind) {
                rows.extend(
                    store
                        .audit_export(kind, since)
                        .await
                        .with_context(|| format!("cannot read the {kind} audit"))?,
                );
            }
            sort(&mut rows);
            rows
        }
    };
    let mut out = String::new();
    for row in rows {
        out.push_str(&row.to_string());
        out.push('\n');
    }
    print!("{out}");
    Ok(())
}

/// By time; ties by trail then row id, so output is stable.
fn sort(rows: &mut [Value]) {
    rows.sort_by_key(|r| {
        (
            r["created_at"].as_i64().unwrap_or(0),
            r["kind"].as_str().unwrap_or("").to_string(),
            r["id"].as_i64().unwrap_or(0),
        )
    });
}
