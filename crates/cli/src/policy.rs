//! `manifold policy ...`

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use manifold_operations as ops;
use manifold_store::PrincipalSelector;

use crate::{ConfigArg, print_json, print_table};

#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// List rules, oldest first.
    List {
        #[command(flatten)]
        config: ConfigArg,
        #[arg(long)]
        json: bool,
    },
    /// Add a rule; prints its id.
    Add {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        rule: RuleArgs,
    },
    /// Replace a rule's contents (same flags and defaults as `add`).
    Update {
        #[command(flatten)]
        config: ConfigArg,
        id: String,
        #[command(flatten)]
        rule: RuleArgs,
    },
    /// Delete a rule.
    Remove {
        #[command(flatten)]
        config: ConfigArg,
        id: String,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum EffectArg {
    Allow,
    Deny,
    RequireApproval,
    RateLimit,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum TierArg {
    Any,
    ReadOnly,
    Write,
    Destructive,
}

#[derive(Args, Debug)]
pub struct RuleArgs {
    #[arg(long, value_enum)]
    effect: EffectArg,
    /// `*`, `token:<id>`, `user:<id>` or `group:<name>`.
    #[arg(long, default_value = "*", value_parser = parse_principal)]
    principal: PrincipalSelector,
    /// Glob over server names.
    #[arg(long, default_value = "*")]
    server: String,
    /// Glob over tool names (unqualified).
    #[arg(long, default_value = "*")]
    tool: String,
    #[arg(long, value_enum, default_value = "any")]
    tier: TierArg,
    /// Calls per window (rate_limit only).
    #[arg(long)]
    limit: Option<u32>,
    /// Window length: `60`, `60s`, `5m`, `1h` (rate_limit only).
    #[arg(long)]
    window: Option<String>,
    #[arg(long, default_value = "")]
    description: String,
}

impl RuleArgs {
    /// The API's input for this rule; `ops::new_policy` checks it.
    fn to_input(&self) -> anyhow::Result<ops::PolicyInput> {
        match (self.effect, self.limit, self.window.as_ref()) {
            (EffectArg::RateLimit, Some(_), Some(_)) => {}
            (EffectArg::RateLimit, _, _) => {
                bail!("--effect rate_limit needs --limit N and --window (e.g. 60s, 5m, 1h)")
            }
            (_, Some(_), _) | (_, _, Some(_)) => {
                bail!("--limit and --window apply only to --effect rate_limit")
            }
            _ => {}
        }
        let window_seconds = match &self.window {
            Some(window) => {
                let window = ops::parse_duration(window).context("invalid --window")?;
                Some(
                    u32::try_from(window.as_secs())
                        .ok()
                        .context("--window is too long")?,
                )
            }
            None => None,
        };
        let effect = match self.effect {
            EffectArg::Allow => "allow",
            EffectArg::Deny => "deny",
            EffectArg::RequireApproval => "require_approval",
            EffectArg::RateLimit => "rate_limit",
        };
        let tier = match self.tier {
            TierArg::Any => "any",
            TierArg::ReadOnly => "read_only",
            TierArg::Write => "write",
            TierArg::Destructive => "destructive",
        };
        let input = ops::PolicyInput {
            effect: effect.to_string(),
            principal: Some(ops::principal_text(&self.principal)),
            server: Some(self.server.clone()),
            tool: Some(self.tool.clone()),
            tier: Some(tier.to_string()),
            limit: self.limit,
            window_seconds,
            description: Some(self.description.clone()),
        };
        // Checked before the store is opened.
        ops::new_policy(&input)?;
        Ok(input)
    }
}

fn parse_principal(s: &str) -> Result<PrincipalSelector, String> {
    s.parse()
        .map_err(|e: manifold_store::StoreError| e.to_string())
}

pub async fn run_policy(command: PolicyCommand) -> anyhow::Result<()> {
    match command {
        PolicyCommand::List { config, json } => {
            let store = config.open().await?;
            let policies = ops::list_policies(&store)
                .await
                .context("cannot list policies")?;
            if json {
                print_json(&policies)?;
            } else {
                let rows: Vec<Vec<String>> = policies
                    .iter()
                    .map(|p| {
                        vec![
                            p.id.clone(),
                            p.principal.clone(),
                            p.server.clone(),
                            p.tool.clone(),
                            p.tier.clone(),
                            effect_text(p),
                            p.description.clone(),
                        ]
                    })
                    .collect();
                print_table(
                    &[
                        "ID",
                        "PRINCIPAL",
                        "SERVER",
                        "TOOL",
                        "TIER",
                        "EFFECT",
                        "DESCRIPTION",
                    ],
                    &rows,
                );
            }
        }
        PolicyCommand::Add { config, rule } => {
            let input = rule.to_input()?;
            let store = config.open().await?;
            let policy = ops::create_policy(&store, &input)
                .await
                .context("cannot add the policy")?;
            println!("{}", policy.id);
        }
        PolicyCommand::Update { config, id, rule } => {
            let input = rule.to_input()?;
            let store = config.open().await?;
            let policy = ops::update_policy(&store, &id, &input)
                .await
                .with_context(|| format!("cannot update policy '{id}'"))?;
            println!(
                "updated {}: {} {} on {}/{} tier {}",
                policy.id,
                policy.principal,
                effect_text(&policy),
                policy.server,
                policy.tool,
                policy.tier
            );
        }
        PolicyCommand::Remove { config, id } => {
            let store = config.open().await?;
            if let Err(e) = ops::delete_policy(&store, &id).await {
                match e {
                    ops::AdminError::NotFound(_) => bail!("no policy with id '{id}'"),
                    e => return Err(e).context("cannot remove the policy"),
                }
            }
            println!("removed policy {id}");
        }
    }
    Ok(())
}

fn effect_text(p: &ops::PolicyInfo) -> String {
    match (p.limit, p.window_seconds) {
        (Some(limit), Some(window)) => format!("rate_limit {limit}/{window}s"),
        _ => p.effect.clone(),
    }
}
