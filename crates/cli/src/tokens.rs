//! `manifold token ...`

use anyhow::{Context, bail};
use clap::Subcommand;
use manifold_operations as ops;

use crate::{ConfigArg, joined, print_json, print_table};

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
            if let Some(expires) = expires.as_deref().filter(|e| *e != "never") {
                ops::parse_duration(expires).context("invalid --expires")?;
            }
            let store = config.open().await?;
            let request = ops::CreateToken {
                name,
                expires,
                actions,
                scopes,
                groups,
            };
            let created = ops::create_token(&store, request)
                .await
                .context("cannot create the token")?;
            if json {
                print_json(&created)?;
            } else {
                let t = &created;
                println!("token: {}", created.token);
                println!("id: {}", t.id);
                println!("name: {}", t.name);
                println!("actions: {}", joined(&t.actions));
                println!("scopes: {}", joined(&t.scopes));
                println!("groups: {}", joined(&t.groups));
                println!("expires: {}", t.expires);
                println!("This token will not be shown again: store it now.");
            }
        }
        TokenCommand::List { config, json } => {
            let store = config.open().await?;
            let tokens = ops::list_tokens(&store)
                .await
                .context("cannot list tokens")?;
            if json {
                print_json(&tokens)?;
            } else {
                let rows: Vec<Vec<String>> = tokens
                    .iter()
                    .map(|t| {
                        vec![
                            t.id.clone(),
                            t.name.clone(),
                            joined(&t.actions),
                            joined(&t.scopes),
                            joined(&t.groups),
                            t.expires.clone(),
                            t.state.clone(),
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
            match ops::revoke_token(&store, &id).await {
                Ok(_) => println!("revoked token {id}"),
                Err(e) => bail!("{e}"),
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
