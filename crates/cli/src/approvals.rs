//! `manifold approvals ...`

use anyhow::Context;
use clap::Subcommand;
use manifold_operations as ops;

use crate::{ConfigArg, print_json, print_table};

/// Longest argument preview in the table; `--json` has them whole.
const ARGS_PREVIEW: usize = 60;

#[derive(Subcommand, Debug)]
pub enum ApprovalsCommand {
    /// Pending, unexpired requests, oldest first.
    List {
        #[command(flatten)]
        config: ConfigArg,
        #[arg(long)]
        json: bool,
    },
    /// Approve a pending request.
    Approve {
        #[command(flatten)]
        config: ConfigArg,
        id: String,
        /// Recorded as the decider. Default: `cli:$USER`.
        #[arg(long)]
        by: Option<String>,
    },
    /// Deny a pending request.
    Deny {
        #[command(flatten)]
        config: ConfigArg,
        id: String,
        /// Recorded as the decider. Default: `cli:$USER`.
        #[arg(long)]
        by: Option<String>,
    },
}

pub async fn run_approvals(command: ApprovalsCommand) -> anyhow::Result<()> {
    let (config, id, by, approve) = match command {
        ApprovalsCommand::List { config, json } => {
            let store = config.open().await?;
            let pending = ops::pending_approvals(&store)
                .await
                .context("cannot list approvals")?;
            if json {
                return print_json(&pending);
            }
            let rows: Vec<Vec<String>> = pending
                .iter()
                .map(|a| {
                    vec![
                        a.id.clone(),
                        a.principal.clone(),
                        a.tool.clone(),
                        preview(&a.redacted_args.to_string()),
                        ops::format_ms(a.expires_at),
                    ]
                })
                .collect();
            print_table(&["ID", "PRINCIPAL", "TOOL", "ARGS", "EXPIRES"], &rows);
            return Ok(());
        }
        ApprovalsCommand::Approve { config, id, by } => (config, id, by, true),
        ApprovalsCommand::Deny { config, id, by } => (config, id, by, false),
    };
    let by = by.unwrap_or_else(default_decider);
    let store = config.open().await?;
    let verb = if approve { "approve" } else { "deny" };
    let decided = ops::decide_approval(&store, &id, approve, &by, None)
        .await
        .with_context(|| format!("cannot {verb} '{id}'"))?;
    print_decided(&decided);
    Ok(())
}

fn default_decider() -> String {
    match std::env::var("USER") {
        Ok(user) if !user.trim().is_empty() => format!("cli:{user}"),
        _ => "cli".to_string(),
    }
}

fn preview(text: &str) -> String {
    if text.chars().count() <= ARGS_PREVIEW {
        return text.to_string();
    }
    let cut: String = text.chars().take(ARGS_PREVIEW - 3).collect();
    format!("{cut}...")
}

fn print_decided(a: &ops::ApprovalInfo) {
    println!("approval {}: {}", a.id, a.status);
    println!("principal: {}", a.principal);
    println!("tool: {}", a.tool);
    println!("args: {}", a.redacted_args);
    println!("decided by: {}", a.decided_by.as_deref().unwrap_or("-"));
    if let Some(at) = a.decided_at {
        println!("decided at: {}", ops::format_ms(at));
    }
    println!("expires: {}", ops::format_ms(a.expires_at));
}
