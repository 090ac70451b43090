//! `manifold policy ...`

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use manifold_store::{Effect, NewPolicy, Policy, PrincipalSelector, RiskTier, TierSelector};
use serde_json::{Value, json};

use super::{ConfigArg, format_ms, parse_duration, print_json, print_table};

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
    /// `*`, `token:<id>` or `group:<name>`.
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
    fn to_new_policy(&self) -> anyhow::Result<NewPolicy> {
        let effect = match (self.effect, self.limit, &self.window) {
            (EffectArg::RateLimit, Some(limit), Some(window)) => {
                let window = parse_duration(window).context("invalid --window")?;
                let window_seconds = u32::try_from(window.as_secs())
                    .ok()
                    .context("--window is too long")?;
                Effect::RateLimit {
                    limit,
                    window_seconds,
                }
            }
            (EffectArg::RateLimit, _, _) => {
                bail!("--effect rate_limit needs --limit N and --window (e.g. 60s, 5m, 1h)")
            }
            (_, Some(_), _) | (_, _, Some(_)) => {
                bail!("--limit and --window apply only to --effect rate_limit")
            }
            (EffectArg::Allow, ..) => Effect::Allow,
            (EffectArg::Deny, ..) => Effect::Deny,
            (EffectArg::RequireApproval, ..) => Effect::RequireApproval,
        };
        let tier = match self.tier {
            TierArg::Any => TierSelector::Any,
            TierArg::ReadOnly => TierSelector::Only(RiskTier::ReadOnly),
            TierArg::Write => TierSelector::Only(RiskTier::Write),
            TierArg::Destructive => TierSelector::Only(RiskTier::Destructive),
        };
        Ok(NewPolicy {
            principal: self.principal.clone(),
            server_glob: self.server.clone(),
            tool_glob: self.tool.clone(),
            tier,
            effect,
            description: self.description.clone(),
        })
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
            let policies = store
                .list_policies()
                .await
                .context("cannot list policies")?;
            if json {
                print_json(&policies.iter().map(policy_json).collect::<Vec<_>>())?;
            } else {
                let rows: Vec<Vec<String>> = policies
                    .iter()
                    .map(|p| {
                        vec![
                            p.id.clone(),
                            principal_text(&p.principal),
                            p.server_glob.clone(),
                            p.tool_glob.clone(),
                            tier_text(p.tier).to_string(),
                            effect_text(p.effect),
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
            let new = rule.to_new_policy()?;
            let store = config.open().await?;
            let policy = store
                .create_policy(new)
                .await
                .context("cannot add the policy")?;
            println!("{}", policy.id);
        }
        PolicyCommand::Update { config, id, rule } => {
            let new = rule.to_new_policy()?;
            let store = config.open().await?;
            let policy = store
                .update_policy(&id, new)
                .await
                .with_context(|| format!("cannot update policy '{id}'"))?;
            println!(
                "updated {}: {} {} on {}/{} tier {}",
                policy.id,
                principal_text(&policy.principal),
                effect_text(policy.effect),
                policy.server_glob,
                policy.tool_glob,
                tier_text(policy.tier)
            );
        }
        PolicyCommand::Remove { config, id } => {
            let store = config.open().await?;
            if !store
                .delete_policy(&id)
                .await
                .context("cannot remove the policy")?
            {
                bail!("no policy with id '{id}'");
            }
            println!("removed policy {id}");
        }
    }
    Ok(())
}

fn principal_text(p: &PrincipalSelector) -> String {
    match p {
        PrincipalSelector::Everyone => "*".to_string(),
        PrincipalSelector::Token(id) => format!("token:{id}"),
        PrincipalSelector::Group(g) => format!("group:{g}"),
    }
}

fn tier_text(t: TierSelector) -> &'static str {
    match t {
        TierSelector::Any => "any",
        TierSelector::Only(tier) => tier.as_str(),
    }
}

fn effect_name(e: Effect) -> &'static str {
    match e {
        Effect::Allow => "allow",
        Effect::Deny => "deny",
        Effect::RequireApproval => "require_approval",
        Effect::RateLimit { .. } => "rate_limit",
    }
}

fn effect_text(e: Effect) -> String {
    match e {
        Effect::RateLimit {
            limit,
            window_seconds,
        } => format!("rate_limit {limit}/{window_seconds}s"),
        other => effect_name(other).to_string(),
    }
}

fn policy_json(p: &Policy) -> Value {
    let (limit, window) = match p.effect {
        Effect::RateLimit {
            limit,
            window_seconds,
        } => (Some(limit), Some(window_seconds)),
        _ => (None, None),
    };
    json!({
        "id": p.id,
        "principal": principal_text(&p.principal),
        "server": p.server_glob,
        "tool": p.tool_glob,
        "tier": tier_text(p.tier),
        "effect": effect_name(p.effect),
        "limit": limit,
        "window_seconds": window,
        "description": p.description,
        "created_at": p.created_at,
        "created": format_ms(p.created_at),
    })
}
