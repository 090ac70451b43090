//! Reloading `[[servers]]` while the gateway serves: on SIGHUP, or when the
//! config file's modification time or size changes (checked every second).
//!
//! A reload adds, removes and replaces upstreams in the catalog. Calls in
//! flight keep the upstream they resolved, so a removed or changed server
//! finishes them on its old connection (up to the drain timeout) before
//! that connection closes. A config that does not load is logged and
//! ignored: the running set stays. Other sections are read at start only.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use futures::future::BoxFuture;
use manifold_broker::Governance;
use manifold_catalog::ToolCatalog;
use manifold_config::{
    Config,
    file::{ConfigFile, NewServer},
};
use manifold_server::admin::{ServerEntry, ServerFile, ops::AdminError};
use manifold_upstream::{Upstream, UpstreamConfig, UpstreamEvent, oauth::OAuthClient};
use tokio::sync::{Mutex, mpsc};

/// How often the config file's stamp is compared.
const POLL: Duration = Duration::from_secs(1);

/// What changed in one reload, by server name.
#[derive(Debug, Default)]
pub struct ReloadReport {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

/// What a reload changes: the catalog's upstreams, and which of them
/// governance treats as untrusted.
pub struct Reloader {
    path: PathBuf,
    catalog: Arc<ToolCatalog>,
    governance: Arc<Governance>,
    events: mpsc::UnboundedSender<UpstreamEvent>,
    oauth: OAuthClient,
    drain: Duration,
    /// What the last successful load said; one reload at a time.
    applied: Mutex<Applied>,
}

struct Applied {
    servers: BTreeMap<String, UpstreamConfig>,
    /// Everything but `[[servers]]`, to warn that it needs a restart.
    rest: Option<toml::Table>,
}

impl Reloader {
    pub fn new(
        path: &Path,
        config: &Config,
        catalog: Arc<ToolCatalog>,
        governance: Arc<Governance>,
        events: mpsc::UnboundedSender<UpstreamEvent>,
        oauth: OAuthClient,
    ) -> Arc<Self> {
        Arc::new(Reloader {
            path: path.to_path_buf(),
            catalog,
            governance,
            events,
            oauth,
            drain: Duration::from_millis(config.gateway.drain_timeout_ms),
            applied: Mutex::new(Applied {
                servers: by_name(&config.servers),
                rest: rest_of(&config_text(path)),
            }),
        })
    }

    /// Loads the config again and applies its `[[servers]]`.
    pub async fn reload(&self) -> anyhow::Result<ReloadReport> {
        let mut applied = self.applied.lock().await;
        let config = match Config::load(&self.path) {
            Ok(config) => config,
            Err(error) => {
                metrics::counter!("manifold_config_reloads_total", "result" => "rejected")
                    .increment(1);
                tracing::error!(error = %format!("{error:#}"), "config reload rejected; keeping the running config");
                return Err(error);
            }
        };
        let rest = rest_of(&config_text(&self.path));
        if rest != applied.rest {
            tracing::warn!("config changes outside [[servers]] apply at the next restart");
        }
        let wanted = by_name(&config.servers);
        let mut report = ReloadReport::default();
        let catalog = &self.catalog;
        for name in applied.servers.keys() {
            if !wanted.contains_key(name) {
                if let Some(old) = catalog.remove_server(name) {
                    self.retire(old);
                }
                report.removed.push(name.clone());
            }
        }
        let mut connects = Vec::new();
        for (name, server) in &wanted {
            match applied.servers.get(name) {
                Some(previous) if previous == server => continue,
                Some(_) => report.changed.push(name.clone()),
                None => report.added.push(name.clone()),
            }
            let upstream = Upstream::new(server.clone(), self.events.clone(), self.oauth.clone());
            if let Some(old) = catalog.insert_server(Arc::clone(&upstream)) {
                self.retire(old);
            }
            if server.autoconnect {
                connects.push(async move {
                    if let Err(error) = upstream.connect().await {
                        tracing::warn!(server = %upstream.name(), %error, "connect failed");
                    }
                });
            }
        }
        futures::future::join_all(connects).await;
        self.governance.set_untrusted(
            config
                .servers
                .iter()
                .filter(|s| s.untrusted)
                .map(|s| s.name.clone())
                .collect::<BTreeSet<_>>(),
        );
        // Direct-mode clients hear list_changed for every server touched.
        for server in report
            .added
            .iter()
            .chain(&report.removed)
            .chain(&report.changed)
        {
            let _ = self.events.send(UpstreamEvent::ToolsChanged {
                server: server.clone(),
            });
        }
        applied.servers = wanted;
        applied.rest = rest;
        metrics::counter!("manifold_config_reloads_total", "result" => "applied").increment(1);
        tracing::info!(
            added = ?report.added,
            removed = ?report.removed,
            changed = ?report.changed,
            "config reloaded"
        );
        Ok(report)
    }

    /// Lets the old connection finish its calls, then closes it.
    fn retire(&self, old: Arc<Upstream>) {
        let drain = self.drain;
        tokio::spawn(async move { old.retire(drain).await });
    }
}

/// Reloads on SIGHUP and when the file changes. The signal handler is in
/// place when this returns, so a SIGHUP never falls to the default action
/// (which ends the process).
pub fn watch(reloader: Arc<Reloader>) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        let mut seen = stamp(&reloader.path);
        let mut ticks = tokio::time::interval(POLL);
        loop {
            tokio::select! {
                _ = hangup.recv() => tracing::info!("SIGHUP: reloading the config"),
                _ = ticks.tick() => {
                    if stamp(&reloader.path) == seen {
                        continue;
                    }
                    tracing::info!("config file changed: reloading");
                }
            }
            seen = stamp(&reloader.path);
            let _ = reloader.reload().await;
        }
    });
    Ok(())
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// The servers that should run: a disabled one is as good as absent, so
/// turning `enabled` off in the file stops it, and on again starts it.
fn by_name(servers: &[UpstreamConfig]) -> BTreeMap<String, UpstreamConfig> {
    servers
        .iter()
        .filter(|s| s.enabled)
        .map(|s| (s.name.clone(), s.clone()))
        .collect()
}

fn config_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn rest_of(text: &str) -> Option<toml::Table> {
    let mut table: toml::Table = toml::from_str(text).ok()?;
    table.remove("servers");
    Some(table)
}

/// The console's and the admin API's server forms: the same edits as
/// `manifold servers add|remove` ([`manifold_config::file`]), then a reload,
/// so the change is running when the request is answered. One edit at a
/// time, so two forms sent together cannot lose one of them.
pub struct ConfigServerFile {
    reloader: Arc<Reloader>,
    edits: Mutex<()>,
}

impl ConfigServerFile {
    pub fn new(reloader: Arc<Reloader>) -> Arc<Self> {
        Arc::new(ConfigServerFile {
            reloader,
            edits: Mutex::new(()),
        })
    }

    async fn edit(
        &self,
        change: impl FnOnce(&mut ConfigFile) -> Result<(), AdminError>,
    ) -> Result<(), AdminError> {
        let _one_at_a_time = self.edits.lock().await;
        let invalid = |e: anyhow::Error| AdminError::Invalid(format!("{e:#}"));
        let mut file = ConfigFile::open(&self.reloader.path).map_err(invalid)?;
        change(&mut file)?;
        file.save().map_err(invalid)?;
        drop(file);
        self.reloader.reload().await.map_err(invalid)?;
        Ok(())
    }
}

impl ServerFile for ConfigServerFile {
    fn add(&self, server: ServerEntry) -> BoxFuture<'_, Result<(), AdminError>> {
        Box::pin(self.edit(move |file| {
            if file.server_names().contains(&server.name) {
                return Err(AdminError::Conflict(format!(
                    "the config file already has a server named '{}'",
                    server.name
                )));
            }
            let table = NewServer {
                name: &server.name,
                description: Some(server.description.as_str()),
                url: server.url.as_deref(),
                transport: server.transport.as_deref(),
                command: server.command.as_deref(),
                args: &server.args,
                openapi: server.openapi.as_deref(),
                base_url: server.base_url.as_deref(),
                autoconnect: server.autoconnect,
                runtime: true,
                ..NewServer::default()
            }
            .table()
            .map_err(|e| AdminError::Invalid(e.to_string()))?;
            file.add_server(table)
                .map_err(|e| AdminError::Invalid(format!("{e:#}")))
        }))
    }

    fn remove<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), AdminError>> {
        Box::pin(self.edit(move |file| {
            if !file.server_names().iter().any(|n| n == name) {
                return Err(AdminError::NotFound(format!(
                    "the config file has no server named '{name}'"
                )));
            }
            file.remove_server(name)
                .map_err(|e| AdminError::Invalid(format!("{e:#}")))
        }))
    }
}
