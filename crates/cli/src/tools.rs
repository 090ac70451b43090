//! `manifold tools ...`: classifications and quarantine.

use anyhow::Context;
use clap::{Subcommand, ValueEnum};
use manifold_operations as ops;
use manifold_store::{RiskTier, ToolClassification};

use crate::{ConfigArg, print_json, print_table};

/// How much of a definition hash the table shows (and `--hash` accepts).
use ops::HASH_PREFIX;

#[derive(Subcommand, Debug)]
pub enum ToolsCommand {
    /// Recorded tools: tier, status and definition hash.
    List {
        #[command(flatten)]
        config: ConfigArg,
        /// Only tools that cannot be called until approved.
        #[arg(long)]
        quarantined: bool,
        #[arg(long)]
        json: bool,
    },
    /// Set (or with `none` clear) a tool's risk tier.
    Classify {
        #[command(flatten)]
        config: ConfigArg,
        server: String,
        tool: String,
        #[arg(long, value_enum)]
        tier: ClassifyTier,
    },
    /// Approve a tool's definition, lifting quarantine.
    Approve {
        #[command(flatten)]
        config: ConfigArg,
        server: String,
        tool: String,
        /// The definition hash reviewed (full, or a prefix of 12+ digits).
        /// Default: the definition currently stored.
        #[arg(long)]
        hash: Option<String>,
    },
    /// Quarantine a tool and withdraw its approval.
    Quarantine {
        #[command(flatten)]
        config: ConfigArg,
        server: String,
        tool: String,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum ClassifyTier {
    ReadOnly,
    Write,
    Destructive,
    None,
}

pub async fn run_tools(command: ToolsCommand) -> anyhow::Result<()> {
    match command {
        ToolsCommand::List {
            config,
            quarantined,
            json,
        } => {
            let store = config.open().await?;
            let mut tools = store
                .list_tool_classifications()
                .await
                .context("cannot list tools")?;
            if quarantined {
                tools.retain(|t| !t.is_callable());
            }
            if json {
                print_json(&tools)?;
            } else {
                let rows: Vec<Vec<String>> = tools
                    .iter()
                    .map(|t| {
                        vec![
                            t.server.clone(),
                            t.tool.clone(),
                            t.tier.map_or("-", RiskTier::as_str).to_string(),
                            t.status.as_str().to_string(),
                            prefix(&t.definition_hash).to_string(),
                        ]
                    })
                    .collect();
                print_table(&["SERVER", "TOOL", "TIER", "STATUS", "HASH"], &rows);
            }
        }
        ToolsCommand::Classify {
            config,
            server,
            tool,
            tier,
        } => {
            let tier = match tier {
                ClassifyTier::ReadOnly => Some(RiskTier::ReadOnly),
                ClassifyTier::Write => Some(RiskTier::Write),
                ClassifyTier::Destructive => Some(RiskTier::Destructive),
                ClassifyTier::None => None,
            };
            let store = config.open().await?;
            let t = ops::tool_action(&store, &server, &tool, ops::ToolAction::Classify(tier))
                .await
                .with_context(|| format!("cannot classify {server}/{tool}"))?;
            print_one(&t);
        }
        ToolsCommand::Approve {
            config,
            server,
            tool,
            hash,
        } => {
            let store = config.open().await?;
            // Without --hash, the host operator approves what the store holds
            // now; with it, only the definition they reviewed (the answer
            // names both hashes when it has changed).
            let reviewed_hash = match hash {
                Some(h) => h,
                None => {
                    store
                        .tool_classification(&server, &tool)
                        .await
                        .context("cannot read the tool")?
                        .with_context(|| format!("no recorded tool {server}/{tool}"))?
                        .definition_hash
                }
            };
            let action = ops::ToolAction::Approve { reviewed_hash };
            let t = ops::tool_action(&store, &server, &tool, action)
                .await
                .with_context(|| format!("cannot approve {server}/{tool}"))?;
            print_one(&t);
        }
        ToolsCommand::Quarantine {
            config,
            server,
            tool,
        } => {
            let store = config.open().await?;
            let t = ops::tool_action(&store, &server, &tool, ops::ToolAction::Quarantine)
                .await
                .with_context(|| format!("cannot quarantine {server}/{tool}"))?;
            print_one(&t);
        }
    }
    Ok(())
}

fn prefix(hash: &str) -> &str {
    hash.get(..HASH_PREFIX).unwrap_or(hash)
}

fn print_one(t: &ToolClassification) {
    println!(
        "{}/{}: {} tier {} hash {}",
        t.server,
        t.tool,
        t.status.as_str(),
        t.tier.map_or("-", RiskTier::as_str),
        prefix(&t.definition_hash)
    );
}
