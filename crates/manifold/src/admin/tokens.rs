//! `manifold token ...`

use std::collections::BTreeSet;

use anyhow::{Context, bail};
use clap::Subcommand;
use manifold_store::{Action, Expiry, NewToken, TokenRecord, now_ms};
use serde_json::{Value, json};

use super::{ConfigArg, format_ms, joined, parse_duration, print_json, print_table};

#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a token; its secret is printed once.
    Create {
        #[command(flatten)]
        config: ConfigArg,
        #[arg(long)]
        name: String,
        /// `30d`, `12h`, `90m`, `45s`, seconds, or `never`. Default: 90 days.
        #[arg(long)]
        expires: Option<String>,
        /// discover, call, code or admin; repeatable. Default: discover, call, code.
        #[arg(long = "action")]
        actions: Vec<String>,
        /// Glob over `server__tool`; repeatable. Default: `*`.
        #[arg(long = "scope")]
        scopes: Vec<String>,
        /// Group to put the token in; repeatable.
        #[arg(long = "group")]
        groups: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// List tokens (secrets are never stored, so never shown).
    List {
        #[command(flatten)]
        config: ConfigArg,
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token now.
    Revoke {
        #[command(flatten)]
        config: ConfigArg,
        id: String,
    },
    /// Put a token in a group or take it out.
    Group {
        #[command(subcommand)]
        command: GroupCommand,
    },
}

#[derive(Subcommand, Debug)]
pub enum GroupCommand {
    Add {
        #[command(flatten)]
        config: ConfigArg,
        id: String,
        group: String,
    },
    Remove {
        #[command(flatten)]
        config: ConfigArg,
        id: String,
        group: String,
    },
}

pub async fn run_token(command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::Create {
            config,
            name,
            expires,
            actions,
            scopes,
            groups,
            json,
        } => {
            let expiry = parse_expiry(expires.as_deref())?;
            let actions: BTreeSet<Action> = if actions.is_empty() {
                [Action::Discover, Action::Call, Action::Code].into()
            } else {
                actions
                    .iter()
                    .map(|a| a.parse::<Action>())
                    .collect::<Result<_, _>>()?
            };
            let scopes = if scopes.is_empty() {
                vec!["*".to_string()]
            } else {
                scopes
            };
            let store = config.open().await?;
            let new = NewToken::new(name, actions, scopes).expiry(expiry);
            let (record, secret) = store
                .create_token(new)
                .await
                .context("cannot create the token")?;
            for group in &groups {
                if let Err(e) = store.add_token_group(&record.id, group).await {
                    // No half-made token: its secret would never be shown.
                    let _ = store.delete_token(&record.id).await;
                    return Err(e).context("cannot add the token to its group");
                }
            }
            let groups: Vec<String> = groups
                .into_iter()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            if json {
                let mut value = token_json(&record, &groups, now_ms());
                value["token"] = Value::String(secret);
                print_json(&value)?;
            } else {
                println!("token: {secret}");
                println!("id: {}", record.id);
                println!("name: {}", record.name);
                println!(
                    "actions: {}",
                    joined(record.actions.iter().map(|a| a.as_str()))
                );
                println!("scopes: {}", joined(&record.scopes));
                println!("groups: {}", joined(&groups));
                println!("expires: {}", expires_text(&record));
                println!("This token will not be shown again: store it now.");
            }
        }
        TokenCommand::List { config, json } => {
            let store = config.open().await?;
            let tokens = store.list_tokens().await.context("cannot list tokens")?;
            let groups = store
                .load_policy_inputs()
                .await
                .context("cannot read token groups")?;
            let now = now_ms();
            if json {
                let rows: Vec<Value> = tokens
                    .iter()
                    .map(|t| token_json(t, &Vec::from_iter(groups.groups_of(&t.id)), now))
                    .collect();
                print_json(&rows)?;
            } else {
                let rows: Vec<Vec<String>> = tokens
                    .iter()
                    .map(|t| {
                        vec![
                            t.id.clone(),
                            t.name.clone(),
                            joined(t.actions.iter().map(|a| a.as_str())),
                            joined(&t.scopes),
                            joined(groups.groups_of(&t.id)),
                            expires_text(t),
                            state(t, now).to_string(),
                        ]
                    })
                    .collect();
                print_table(
                    &[
                        "ID", "NAME", "ACTIONS", "SCOPES", "GROUPS", "EXPIRES", "STATE",
                    ],
                    &rows,
                );
            }
        }
        TokenCommand::Revoke { config, id } => {
            let store = config.open().await?;
            if store.revoke_token(&id).await.context("cannot revoke")? {
                println!("revoked token {id}");
            } else {
                match store.get_token(&id).await? {
                    Some(_) => bail!("token '{id}' is already revoked"),
                    None => bail!("no token with id '{id}'"),
                }
            }
        }
        TokenCommand::Group {
            command: GroupCommand::Add { config, id, group },
        } => {
            let store = config.open().await?;
            store
                .add_token_group(&id, &group)
                .await
                .with_context(|| format!("cannot add token '{id}' to group '{group}'"))?;
            println!("token {id} is in group {group}");
        }
        TokenCommand::Group {
            command: GroupCommand::Remove { config, id, group },
        } => {
            let store = config.open().await?;
            if !store
                .remove_token_group(&id, &group)
                .await
                .context("cannot remove the group")?
            {
                bail!("token '{id}' is not in group '{group}'");
            }
            println!("token {id} is no longer in group {group}");
        }
    }
    Ok(())
}

fn parse_expiry(text: Option<&str>) -> anyhow::Result<Expiry> {
    Ok(match text {
        None => Expiry::Default,
        Some("never") => Expiry::Never,
        Some(d) => Expiry::After(parse_duration(d).context("invalid --expires")?),
    })
}

fn expires_text(t: &TokenRecord) -> String {
    t.expires_at.map_or_else(|| "never".to_string(), format_ms)
}

fn state(t: &TokenRecord, now: i64) -> &'static str {
    if t.is_revoked() {
        "revoked"
    } else if t.is_expired(now) {
        "expired"
    } else {
        "active"
    }
}

fn token_json(t: &TokenRecord, groups: &[String], now: i64) -> Value {
    json!({
        "id": t.id,
        "name": t.name,
        "actions": t.actions.iter().map(|a| a.as_str()).collect::<Vec<_>>(),
        "scopes": t.scopes,
        "groups": groups,
        "created_at": t.created_at,
        "expires_at": t.expires_at,
        "expires": expires_text(t),
        "revoked_at": t.revoked_at,
        "state": state(t, now),
    })
}
