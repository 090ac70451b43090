//! `manifold init`, `manifold import` and `manifold servers …`: the config
//! file as the operator's record of servers. Every change goes through
//! [`manifold_config::file`], so comments survive and a running gateway
//! picks the change up through its reload (it watches the file).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Subcommand;
use manifold_config::{
    Config,
    file::{self, ConfigFile, NewServer},
    import,
};

use crate::progress::Progress;

const DEFAULT_CONFIG: &str = "manifold.toml";
/// From this many servers on, `import --write` shows its progress.
const MANY_SERVERS: usize = 10;

#[derive(Subcommand, Debug)]
pub enum ServersCommand {
    /// The servers in the config, with their transport and switch.
    List {
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Add a server: `--url URL`, `--openapi FILE|URL`, or a command after `--`.
    Add {
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        name: String,
        #[arg(long)]
        description: Option<String>,
        /// An HTTP server (Streamable HTTP, or legacy SSE: see --transport).
        #[arg(long, conflicts_with = "command")]
        url: Option<String>,
        /// How to reach the --url server: auto (the default: Streamable
        /// HTTP, else legacy SSE), streamable_http or sse.
        #[arg(long, requires = "url", value_parser = ["auto", "streamable_http", "sse"])]
        transport: Option<String>,
        /// An HTTP API by its OpenAPI document (a file or an https URL).
        #[arg(long, conflicts_with_all = ["command", "url"])]
        openapi: Option<String>,
        /// Where an OpenAPI server's requests go (default: the document's
        /// first server).
        #[arg(long, requires = "openapi")]
        base_url: Option<String>,
        /// KEY=VALUE for the child's environment (use ${VAR} for secrets).
        #[arg(long = "env", value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// KEY=VALUE request headers for an HTTP or OpenAPI server.
        #[arg(long = "header", value_name = "KEY=VALUE")]
        headers: Vec<String>,
        /// The stdio server's command and arguments.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Remove a server from the config.
    Remove {
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        name: String,
    },
    /// Turn a server on for everyone (`enabled`).
    Enable {
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        name: String,
    },
    /// Turn a server off for everyone: not started, listed or callable.
    Disable {
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        name: String,
    },
}

pub fn init(config: &Path) -> anyhow::Result<()> {
    file::init(config)?;
    println!(
        "wrote {}; start it with: manifold serve --config {}",
        config.display(),
        config.display()
    );
    Ok(())
}

fn pairs(items: &[String], what: &str) -> anyhow::Result<Vec<(String, String)>> {
    items
        .iter()
        .map(|item| {
            let (k, v) = item
                .split_once('=')
                .with_context(|| format!("--{what} takes KEY=VALUE, not {item:?}"))?;
            Ok((k.to_string(), v.to_string()))
        })
        .collect()
}

pub fn run(command: ServersCommand) -> anyhow::Result<()> {
    match command {
        ServersCommand::List { config } => {
            let loaded = Config::load(&config)?;
            for server in &loaded.servers {
                let transport = match (&server.command, &server.url) {
                    (Some(command), _) => format!("stdio  {command} {}", server.args.join(" ")),
                    (_, Some(url)) => format!("http   {url}"),
                    _ => match &server.openapi {
                        Some(document) => format!("openapi {document}"),
                        None => String::new(),
                    },
                };
                let state = if server.enabled {
                    "enabled "
                } else {
                    "DISABLED"
                };
                println!("{state}  {:<20} {transport}", server.name);
            }
            Ok(())
        }
        ServersCommand::Add {
            config,
            name,
            description,
            url,
            transport,
            openapi,
            base_url,
            env,
            headers,
            command,
        } => {
            let (program, args) = match command.split_first() {
                Some((program, args)) => (Some(program.as_str()), args),
                None => (None, &[][..]),
            };
            let kinds = [url.is_some(), program.is_some(), openapi.is_some()];
            if kinds.iter().filter(|given| **given).count() != 1 {
                bail!(
                    "give --url URL, --openapi FILE|URL, or the command after `--` (manifold servers add NAME -- COMMAND ARGS…)"
                );
            }
            let table = NewServer {
                name: &name,
                description: description.as_deref(),
                url: url.as_deref(),
                transport: transport.as_deref(),
                headers: pairs(&headers, "header")?,
                command: program,
                args,
                env: pairs(&env, "env")?,
                openapi: openapi.as_deref(),
                base_url: base_url.as_deref(),
                autoconnect: true,
                // The operator's own entry, like one written by hand.
                runtime: false,
            }
            .table()?;
            edit(&config, |file| file.add_server(table))?;
            println!("added '{name}' to {}", config.display());
            Ok(())
        }
        ServersCommand::Remove { config, name } => {
            edit(&config, |file| file.remove_server(&name))?;
            println!("removed '{name}' from {}", config.display());
            Ok(())
        }
        ServersCommand::Enable { config, name } => {
            edit(&config, |file| file.set_enabled(&name, true))?;
            println!("enabled '{name}' in {}", config.display());
            Ok(())
        }
        ServersCommand::Disable { config, name } => {
            edit(&config, |file| file.set_enabled(&name, false))?;
            println!("disabled '{name}' in {}", config.display());
            Ok(())
        }
    }
}

fn edit(
    config: &Path,
    change: impl FnOnce(&mut ConfigFile) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut file = ConfigFile::open(config)?;
    change(&mut file)?;
    file.save()
}

/// `manifold import --from CLIENT|FILE [--config F] [--write]`.
pub fn import(from: &str, config: &Path, write: bool) -> anyhow::Result<()> {
    let path = if Path::new(from).is_file() {
        PathBuf::from(from)
    } else {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default();
        let cwd = std::env::current_dir()?;
        let candidates = import::known_locations(from, &home, &cwd)?;
        candidates
            .iter()
            .find(|p| p.is_file())
            .cloned()
            .with_context(|| {
                format!(
                    "no {from} config found; looked in {}",
                    candidates
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?
    };
    let imported = import::import_file(&path, &secret_shaped)?;
    eprintln!(
        "read {} server(s) from {}",
        imported.servers.len() + imported.skipped.len(),
        path.display()
    );
    for (name, reason) in &imported.skipped {
        eprintln!("not converted: {name}: {reason}");
    }
    for (name, note) in &imported.notes {
        eprintln!("note: {name}: {note}");
    }
    if !imported.variables.is_empty() {
        eprintln!("set these variables where the gateway runs:");
        for (var, about) in &imported.variables {
            eprintln!("  {var}  ({about})");
        }
    }
    if !write {
        print!("{}", imported.toml());
        return Ok(());
    }
    let mut file = ConfigFile::open(config)?;
    let mut added = 0;
    // A few servers take no time; a long list gets a bar.
    let progress = (imported.servers.len() >= MANY_SERVERS)
        .then(|| Progress::new("adding servers", imported.servers.len() as u64));
    for server in imported.servers {
        match file.add_server(server.table) {
            Ok(()) => added += 1,
            Err(error) => eprintln!("not added: {}: {error:#}", server.name),
        }
        if let Some(progress) = &progress {
            progress.inc(1);
        }
    }
    if let Some(progress) = &progress {
        progress.finish();
    }
    file.save()?;
    eprintln!("added {added} server(s) to {}", config.display());
    Ok(())
}

/// Whether a value has the form of a credential: the patterns the broker
/// masks in tool results.
fn secret_shaped(value: &str) -> bool {
    manifold_broker::guardrails::mask_text(value, &mut Default::default()).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token under a name that says nothing is still kept out of the file.
    #[test]
    fn a_value_shaped_like_a_key_becomes_a_variable() {
        let json = serde_json::json!({"mcpServers": {
            "tracker": {"command": "tracker-mcp",
                        "env": {"TRACKER": "ghp_0123456789abcdefghijABCDEFGHIJ012345", "TZ": "UTC"}}
        }});
        let import = import::import_json(&json, Path::new("/w"), &secret_shaped).unwrap();
        let toml = import.toml();
        assert!(!toml.contains("ghp_"), "{toml}");
        assert!(toml.contains("TRACKER = \"${TRACKER}\""), "{toml}");
        assert!(toml.contains("TZ = \"UTC\""), "{toml}");
    }
}
