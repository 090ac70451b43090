//! The TOML config file.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use manifold_search::Strategy;
use manifold_server::Mode;
use manifold_upstream::UpstreamConfig;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub gateway: GatewayConfig,
    #[serde(default)]
    pub store: StoreConfig,
    #[serde(default)]
    pub servers: Vec<UpstreamConfig>,
    /// The folder the config file is in; relative paths resolve against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// Where governance state lives.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `postgres://…` for a shared database; unset: SQLite in `data_dir`.
    /// `MANIFOLD_DATABASE_URL` overrides it, so a password need not sit in
    /// the file.
    pub database_url: Option<String>,
    /// Holds `manifold.db` when no URL is given. Relative to the config's
    /// folder; default `.manifold`.
    pub data_dir: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    #[serde(default = "default_listen")]
    pub listen: String,
    #[serde(default)]
    pub mode: Mode,
    #[serde(default = "default_context_window")]
    pub context_window_tokens: usize,
    #[serde(default = "default_threshold")]
    pub threshold_percent: f64,
    /// `server__tool` names; a single-server set-up may turn this off.
    #[serde(default = "yes")]
    pub qualify_names: bool,
    #[serde(default)]
    pub search_strategy: Strategy,
    /// Host names accepted on `/mcp` besides loopback (DNS-rebinding guard).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Give legacy (2025-11-25 and older) HTTP clients a session, which
    /// sampling and elicitation requests to them need. Off: every request is
    /// stateless and GET/DELETE on `/mcp` are 405. 2026-07-28 clients are
    /// stateless either way.
    #[serde(default)]
    pub legacy_sessions: bool,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        toml::from_str("").expect("empty gateway config is valid")
    }
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
fn default_context_window() -> usize {
    200_000
}
fn default_threshold() -> f64 {
    2.0
}
fn yes() -> bool {
    true
}

impl Config {
    /// Read and check a config file. Relative commands and working directories
    /// resolve against the file's folder, so a config works from anywhere.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        let mut config: Config =
            toml::from_str(&text).with_context(|| format!("invalid config {}", path.display()))?;
        // `Path::new("m.toml").parent()` is `Some("")`: treat that as ".".
        let base = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let base = std::fs::canonicalize(&base).unwrap_or(base);
        config.base_dir = base.clone();
        let mut seen = std::collections::HashSet::new();
        for server in &mut config.servers {
            server.validate().map_err(anyhow::Error::msg)?;
            if !seen.insert(server.name.clone()) {
                bail!("server name '{}' appears twice", server.name);
            }
            if server.command.is_some() {
                server.cwd = Some(match server.cwd.take() {
                    Some(cwd) if cwd.is_relative() => base.join(cwd),
                    Some(cwd) => cwd,
                    None => base.clone(),
                });
                server.command = server.command.take().map(|c| resolve_command(&c, &base));
            }
        }
        if !(config.gateway.threshold_percent > 0.0 && config.gateway.threshold_percent <= 100.0) {
            bail!("gateway.threshold_percent must be in (0, 100]");
        }
        Ok(config)
    }
}

impl Config {
    /// The database URL: `MANIFOLD_DATABASE_URL`, else `store.database_url`,
    /// else a SQLite file in the data dir.
    pub fn database_url(&self) -> String {
        if let Ok(url) = std::env::var("MANIFOLD_DATABASE_URL")
            && !url.trim().is_empty()
        {
            return url;
        }
        if let Some(url) = &self.store.database_url {
            return url.clone();
        }
        manifold_store::sqlite_url(&self.data_dir().join(manifold_store::SQLITE_FILE_NAME))
    }

    pub fn data_dir(&self) -> PathBuf {
        match &self.store.data_dir {
            Some(dir) if dir.is_absolute() => dir.clone(),
            Some(dir) => self.base_dir.join(dir),
            None => self.base_dir.join(".manifold"),
        }
    }

    /// Opens the governance store the config names, creating the SQLite data
    /// dir if needed and applying migrations.
    pub async fn open_store(&self) -> anyhow::Result<manifold_store::Store> {
        let url = self.database_url();
        if url.starts_with("sqlite:") && self.store.database_url.is_none() {
            let dir = self.data_dir();
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create data dir {}", dir.display()))?;
        }
        manifold_store::Store::connect(&url)
            .await
            .context("cannot open the governance store")
    }
}

/// A bare command name is looked up next to the `manifold` binary first (where
/// the fixture servers are built), then on `PATH`; a relative path is taken
/// from the config's folder.
fn resolve_command(command: &str, base: &Path) -> String {
    if command.contains('/') {
        let p = Path::new(command);
        return if p.is_relative() {
            base.join(p).to_string_lossy().into_owned()
        } else {
            command.to_string()
        };
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        let candidate = dir.join(command);
        if candidate.is_file() {
            return candidate.to_string_lossy().into_owned();
        }
    }
    command.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let dir = std::env::temp_dir().join(format!("manifold-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.toml");
        std::fs::write(
            &path,
            r#"
[gateway]
listen = "127.0.0.1:8080"
mode = "auto"
context_window_tokens = 200000
threshold_percent = 2.0

[[servers]]
name = "time"
description = "Current time and timezone conversion"
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]
env = { TZ = "UTC" }
autoconnect = true

[[servers]]
name = "tickets"
description = "Issue tracker"
url = "http://127.0.0.1:9000/mcp"
headers = { Authorization = "Bearer ${TICKETS_TOKEN}" }
"#,
        )
        .unwrap();
        let config = Config::load(&path).unwrap();
        assert_eq!(config.servers.len(), 2);
        assert_eq!(config.gateway.mode, Mode::Auto);
        assert_eq!(
            config.servers[0].cwd.as_deref(),
            Some(std::fs::canonicalize(&dir).unwrap().as_path())
        );
        std::fs::write(&path, "[gateway]\nmode = \"sideways\"\n").unwrap();
        let err = format!("{:#}", Config::load(&path).unwrap_err());
        assert!(err.contains("sideways") || err.contains("mode"), "{err}");
        std::fs::write(&path, "[[servers]]\nname = \"a\"\ncommand = \"x\"\n[[servers]]\nname = \"a\"\ncommand = \"y\"\n").unwrap();
        assert!(format!("{:#}", Config::load(&path).unwrap_err()).contains("twice"));
    }
}
