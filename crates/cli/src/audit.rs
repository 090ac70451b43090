//! `manifold audit ...`: the audit trails as JSON lines.

use anyhow::Context;
use clap::{Subcommand, ValueEnum};
use manifold_operations as ops;
use manifold_store::AuditKind;

use crate::ConfigArg;

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
            ops::audit_tail(&store, &kinds(kind), n)
                .await
                .context("cannot read the audit")?
        }
        AuditCommand::Export {
            config,
            kind,
            since,
        } => {
            let since = ops::parse_since(since.as_deref()).context("invalid --since")?;
            let store = config.open().await?;
            ops::audit_export(&store, &kinds(kind), since)
                .await
                .context("cannot read the audit")?
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
