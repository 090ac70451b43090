//! Wiring: config → upstreams → catalog → broker → surface.

use std::{path::Path, sync::Arc, time::Duration};

use anyhow::Context;
use manifold_broker::{Caller, Governance};
use manifold_catalog::{Principal, ToolCatalog};
use manifold_config::Config;
use manifold_server::{
    AuthConfig, Discovery, GatewayParts, GatewayState, ModeDecision, SurfaceConfig,
    admin::ServerFile, decide_mode,
};
use manifold_store::Store;
use manifold_upstream::{Upstream, UpstreamState};
use tokio_util::sync::CancellationToken;

use crate::{
    reload::{ConfigServerFile, Reloader},
    settings,
};

/// A started gateway: upstreams connected, catalog listed, mode decided.
pub struct Started {
    pub state: Arc<GatewayState>,
    pub decision: ModeDecision,
    pub config: Config,
    /// Reloads `[[servers]]` while HTTP serves; none for stdio and offline
    /// commands.
    pub reloader: Option<Arc<Reloader>>,
}

/// `listen`: where HTTP will listen (decides whether auth is on by
/// default, and gives the gateway a config file to reload and write);
/// `None` for stdio and offline commands.
pub async fn start(path: &Path, listen: Option<&str>) -> anyhow::Result<Started> {
    let config = Config::load(path)?;
    for (setting, why) in config.security_warnings() {
        tracing::warn!(setting, "{why}");
    }
    let store = config.open_store().await?;
    let oauth = crate::oauth::client(&config, &store)?;
    seed_policies(&store, &config).await?;
    // Listening starts before the catalog loads, so that a switch another
    // replica makes meanwhile waits in the subscription, not lost.
    let events = store
        .subscribe()
        .await
        .context("cannot listen for other replicas' events")?;
    let mut governance_config = settings::governance(&config)?;
    if let Some(ms) = config.governance.approval_poll_ms {
        governance_config.approval_poll = Duration::from_millis(ms.max(10));
    } else if events.is_some() {
        // A decision arrives as an event; the poll only covers one that
        // was lost.
        governance_config.approval_poll = Duration::from_secs(1);
    }
    let governance = Governance::new(store, governance_config);
    spawn_sweeps(
        Arc::clone(&governance),
        Duration::from_secs(config.governance.sweep_interval_seconds.max(1)),
    );
    let auth = AuthConfig {
        required: match listen {
            Some(listen) => config.auth_required(listen),
            None => config.auth.required.unwrap_or(false),
        },
        resource_url: config.auth.resource_url.clone(),
        public_url: config.gateway.public_url.clone(),
        oidc: match (&config.auth.oidc, &config.auth.resource_url) {
            (Some(oidc), Some(resource_url)) => {
                let callers = Arc::new(settings::oidc_callers(oidc, resource_url)?);
                let warm = Arc::clone(&callers);
                tokio::spawn(async move { warm.verifier.prefetch().await });
                Some(callers)
            }
            _ => None,
        },
        console: manifold_server::ConsoleSessions {
            idle: Duration::from_secs(config.gateway.console_idle_minutes.max(1) * 60),
            absolute: Duration::from_secs(config.gateway.console_session_hours.max(1) * 3600),
            secure: config
                .gateway
                .public_url
                .as_deref()
                .is_some_and(|url| url.starts_with("https://")),
        },
    };
    let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
    let upstreams = config
        .servers
        .iter()
        .filter(|s| s.enabled)
        .map(|s| Upstream::new(s.clone(), events_tx.clone(), oauth.clone()))
        .collect();
    let catalog = ToolCatalog::new(upstreams, config.gateway.qualify_names);
    // Upstream list changes reach downstream clients through the state, which
    // exists only once the mode is decided; events wait for it.
    let (state_tx, state_rx) = tokio::sync::watch::channel(None::<Arc<GatewayState>>);
    catalog.spawn_event_loop(events_rx, move |event| {
        let event = event.clone();
        let mut state_rx = state_rx.clone();
        tokio::spawn(async move {
            let state = state_rx
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|state| state.clone());
            if let Some(state) = state {
                if let manifold_upstream::UpstreamEvent::ToolsChanged { server } = &event {
                    // Other replicas' connections may not have heard it.
                    state
                        .publish(manifold_store::StoreEvent::ToolsChanged {
                            server: server.clone(),
                        })
                        .await;
                }
                state.announce(&event).await;
            }
        });
    });
    catalog.connect_enabled().await;
    // The mode is decided once, at start: switching later would change the
    // client's tools array mid-conversation and break its prompt cache.
    let view = catalog.view(&Principal::anonymous()).await;
    let decision = decide_mode(
        settings::mode(config.gateway.mode),
        &view,
        config.gateway.context_window_tokens,
        config.gateway.threshold_percent,
    );
    let embedder = load_embedder(&config).await;
    if let Some(embedder) = &embedder {
        embedder.on_progress(Some(log_embedding_progress()));
    }
    let reranker = load_reranker(&config);
    let strategy = default_strategy(
        config.gateway.search_strategy,
        embedder.is_some(),
        reranker.is_some(),
    );
    let surface = SurfaceConfig {
        mode: decision.chosen,
        strategy,
        admission: settings::admission(&config.admission),
        export: config.export.clone(),
        max_body_bytes: config.gateway.max_body_bytes,
        runtime_servers: settings::runtime_servers(&config.admin),
        fast_calls: config.gateway.fast_calls,
        sse: settings::sse_limits(&config.gateway),
        ..SurfaceConfig::default()
    };
    let reloader = listen.is_some().then(|| {
        Reloader::new(
            path,
            &config,
            Arc::clone(&catalog),
            Arc::clone(&governance),
            events_tx.clone(),
            oauth.clone(),
        )
    });
    let mut parts = GatewayParts::new(catalog, governance);
    if config.code_mode.enabled {
        let (sandbox, refusal) = crate::sandbox::start(&config.code_mode).await?;
        parts.code_mode = Some(manifold_codemode::CodeMode::refusing(
            sandbox,
            Arc::clone(&parts.broker),
            settings::run_limits(&config.code_mode),
            refusal,
        ));
    }
    parts.discovery = Discovery::new(
        embedder
            .clone()
            .map(|embedder| embedder as Arc<dyn manifold_search::Embedder>),
        reranker,
    );
    parts.config = surface;
    parts.auth = auth;
    parts.upstream_events = Some(events_tx);
    parts.oauth = oauth;
    parts.server_file = reloader
        .as_ref()
        .map(|reloader| ConfigServerFile::new(Arc::clone(reloader)) as Arc<dyn ServerFile>);
    if listen.is_some() {
        parts.broker.set_replica(crate::oauth::replica_id(&config)?);
        gateway_tasks(&config, &parts.broker).await?;
    }
    let state = GatewayState::new(parts);
    if let Some(embedder) = embedder {
        warm_search_index(&state, &embedder).await;
    }
    let _ = state_tx.send(Some(Arc::clone(&state)));
    if let Some(events) = events {
        tokio::spawn(manifold_server::replicas::follow(
            Arc::clone(&state),
            events,
        ));
    }
    state.mark_ready();
    tracing::info!(
        tools = decision.tools,
        definition_tokens = decision.definition_tokens,
        threshold_tokens = decision.threshold_tokens,
        mode = ?decision.chosen,
        auth_required = state.auth.required,
        "catalog ready"
    );
    Ok(Started {
        state,
        decision,
        config,
        reloader,
    })
}

/// The configured embedding model behind its on-disk cache, or `None` (with
/// a log line saying why and what search falls back to).
async fn load_embedder(config: &Config) -> Option<Arc<manifold_embed::CachedEmbedder>> {
    let embedding = config.search.embedding_resolved(&config.base_dir);
    if !embedding.is_enabled() {
        tracing::info!(
            "search: embeddings are off ([search.embedding] enabled = false); \
             strategies bm25 and regex only, hybrid searches with bm25"
        );
        return None;
    }
    // Without model_dir or MANIFOLD_EMBEDDING_MODEL_DIR, the local model is
    // looked for in $VIRTUAL_ENV, then in a .venv in the config's folder or
    // one of its ancestors (the repository's, for fixtures/demo).
    let search_from = vec![config.base_dir.clone()];
    let described = embedding.describe();
    let started = std::time::Instant::now();
    let opened = tokio::task::spawn_blocking(move || embedding.open(&search_from)).await;
    match opened {
        Ok(Ok(embedder)) => {
            tracing::info!(
                model = %described,
                cache = %embedder.dir().display(),
                load_ms = started.elapsed().as_millis() as u64,
                "search: embedding model loaded; strategies bm25, regex, embedding and hybrid"
            );
            Some(embedder)
        }
        Ok(Err(e)) => {
            tracing::warn!(
                model = %described,
                error = %e,
                "search: embeddings unavailable; searching with bm25 (the embedding strategy \
                 is refused, hybrid searches with bm25)"
            );
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "search: loading the embedding model failed; searching with bm25");
            None
        }
    }
}

/// The `[search.rerank]` chat endpoint, if configured and valid (else a
/// warning: `rerank` is then refused and never the default).
fn load_reranker(config: &Config) -> Option<Arc<dyn manifold_search::Reranker>> {
    let rerank = config.search.rerank.as_ref()?;
    match rerank.reranker() {
        Ok(reranker) => {
            tracing::info!(
                url = %rerank.url,
                model = %rerank.model,
                timeout_ms = rerank.timeout_ms.unwrap_or(2_000),
                "search: rerank strategy available; it falls back to hybrid when the endpoint fails or is slow"
            );
            Some(reranker)
        }
        Err(e) => {
            tracing::warn!(error = %e, "search: the reranker is unavailable; the rerank strategy is refused");
            None
        }
    }
}

/// What `manifold doctor` says of search: the strategy in force and the
/// model it runs on (loading the model as the gateway would).
pub async fn search_in_force(config: &Config) -> serde_json::Value {
    use manifold_embed::Embedder;
    let embedder = load_embedder(config).await;
    let reranker = load_reranker(config).is_some();
    let configured = config.gateway.search_strategy;
    let in_force = default_strategy(configured, embedder.is_some(), reranker);
    serde_json::json!({
        "configured": configured.to_string(),
        "in_force": in_force.to_string(),
        "model": embedder.as_ref().map(|e| e.model_id().to_string()),
        "described": config.search.embedding_resolved(&config.base_dir).describe(),
    })
}

/// The configured default strategy, or `bm25` (said in the log) when it
/// needs an embedding model that is not loaded.
fn default_strategy(
    configured: manifold_search::Strategy,
    embeddings: bool,
    reranker: bool,
) -> manifold_search::Strategy {
    use manifold_search::Strategy;
    match configured {
        Strategy::Rerank if !reranker => {
            let fallback = if embeddings {
                Strategy::Hybrid
            } else {
                Strategy::Bm25
            };
            tracing::warn!(
                configured = %configured,
                strategy = %fallback,
                "search: no reranker is configured ([search.rerank]); using the fallback as the default strategy"
            );
            fallback
        }
        Strategy::Embedding | Strategy::Hybrid if !embeddings => {
            tracing::warn!(
                configured = %configured,
                "search: default strategy is bm25 because no embedding model is loaded"
            );
            Strategy::Bm25
        }
        other => {
            tracing::info!(strategy = %other, "search: default strategy");
            other
        }
    }
}

/// Embeddings of fewer texts than this (a changed server) are not logged.
const LOG_EMBEDDINGS_FROM: usize = 50;

/// The log of a long embedding (the first one of a catalog takes minutes on
/// a small machine): its start, about every tenth, and its end.
fn log_embedding_progress() -> manifold_embed::EmbedProgress {
    let last = std::sync::Mutex::new(0usize);
    Arc::new(move |done: usize, total: usize| {
        if total < LOG_EMBEDDINGS_FROM {
            return;
        }
        let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
        if done == 0 || done >= total || done >= *last + (total / 10).max(1) {
            tracing::info!(done, total, "search: embedding tool texts");
            *last = done;
        }
    })
}

/// Embeds the catalog as everyone sees it now, so the first search does not
/// wait for it; says how many tool vectors came from the cache.
async fn warm_search_index(state: &Arc<GatewayState>, embedder: &manifold_embed::CachedEmbedder) {
    let view = state.catalog.view(&Principal::anonymous()).await;
    let warm_state = Arc::clone(state);
    let started = std::time::Instant::now();
    let index = tokio::task::spawn_blocking(move || warm_state.discovery.index(&view)).await;
    match index {
        Ok(index) => tracing::info!(
            tools = index.len(),
            embedded = embedder.embedded(),
            reused = embedder.reused(),
            vectors = index.has_embeddings(),
            ms = started.elapsed().as_millis() as u64,
            "search: index ready"
        ),
        Err(e) => tracing::warn!(error = %e, "search: building the index failed"),
    }
}

/// Stops the upstreams and their children, then commits every audit row
/// still queued: every exit path ends here.
async fn shutdown_upstreams(state: &GatewayState) {
    for upstream in state.catalog.upstreams() {
        upstream.disconnect().await;
    }
    state.governance().flush_audit().await;
}

/// Adds each config rule the store does not hold yet.
async fn seed_policies(store: &Store, config: &Config) -> anyhow::Result<()> {
    if config.policies.is_empty() {
        return Ok(());
    }
    let existing = store.list_policies().await?;
    for seed in &config.policies {
        let new = seed.to_new_policy()?;
        let present = existing.iter().any(|p| {
            p.principal == new.principal
                && p.server_glob == new.server_glob
                && p.tool_glob == new.tool_glob
                && p.tier == new.tier
                && p.effect == new.effect
        });
        if !present {
            let created = store.create_policy(new).await?;
            tracing::info!(policy = %created.id, "policy seeded from config");
        }
    }
    Ok(())
}

/// Cleanup at start and then on a schedule: expired tokens in passes of at
/// most 500, old approvals, ended rate windows.
/// Lets long calls become tasks the gateway makes (`[gateway]
/// task_after_ms`), when their results can be sealed: with the store's
/// secret key, which on SQLite is made in the data dir if none is given.
/// First, the tasks this replica ran before a restart are marked failed.
async fn gateway_tasks(config: &Config, broker: &manifold_broker::Broker) -> anyhow::Result<()> {
    let backend = broker.governance().store().backend();
    let sealer = match crate::oauth::sealer(config, backend) {
        Ok(sealer) => sealer,
        Err(error) => {
            tracing::info!(
                "gateway-made tasks are off: their results are sealed with the secret key ({error:#})"
            );
            return Ok(());
        }
    };
    let g = &config.gateway;
    broker.enable_gateway_tasks(manifold_broker::GatewayTaskSettings {
        after: Duration::from_millis(g.task_after_ms),
        max_per_principal: g.max_tasks_per_principal,
        max_result_bytes: g.max_task_result_bytes,
        sealer: Arc::new(sealer),
    });
    let failed = broker.fail_orphaned_gateway_tasks().await;
    if failed > 0 {
        tracing::warn!(
            failed,
            "tasks this replica ran before it restarted are marked failed"
        );
    }
    Ok(())
}

fn spawn_sweeps(governance: Arc<Governance>, every: Duration) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        loop {
            ticks.tick().await;
            match governance.sweep().await {
                Ok(report) => {
                    let tokens: usize = report.token_passes.iter().sum();
                    let rows = report.approvals + report.windows + report.tasks + report.audit_rows;
                    if tokens as u64 + rows > 0 {
                        tracing::info!(
                            tokens,
                            passes = report.token_passes.len(),
                            approvals = report.approvals,
                            windows = report.windows,
                            tasks = report.tasks,
                            tasks_unseen = report.tasks_unseen,
                            audit_rows = report.audit_rows,
                            "swept"
                        );
                    }
                }
                Err(error) => tracing::warn!(%error, "sweep failed"),
            }
        }
    });
}

pub async fn serve(path: &Path, listen: Option<String>) -> anyhow::Result<()> {
    let listen = match listen {
        Some(listen) => listen,
        None => Config::load(path)?.gateway.listen,
    };
    // Before start, so that the first connections are counted.
    let metrics = crate::telemetry::install_metrics()?;
    let started = start(path, Some(&listen)).await?;
    let state = Arc::clone(&started.state);
    let shutdown = CancellationToken::new();
    let app = manifold_server::http::router(
        Arc::clone(&state),
        started.config.gateway.allowed_hosts.clone(),
        started.config.gateway.legacy_sessions,
        shutdown.clone(),
        crate::telemetry::metrics_route(metrics, Arc::clone(&state)),
    );
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let local = listener.local_addr()?;
    if let Some(reloader) = started.reloader {
        crate::reload::watch(reloader)?;
    }
    let drain = Duration::from_millis(started.config.gateway.drain_timeout_ms);
    let (stop_accepting, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(manifold_server::http::listen::serve(
        listener,
        app,
        async move {
            let _ = stopped.await;
        },
    ));
    let terminated = termination()?;
    // Tests and scripts read this line to find the port.
    eprintln!("manifold listening on http://{local}/mcp");
    tracing::info!(%local, "serving /mcp");
    tokio::select! {
        result = &mut server => {
            shutdown_upstreams(&state).await;
            return Ok(result??);
        }
        () = terminated => {}
    }
    drain_and_stop(&state, stop_accepting, shutdown, server, drain).await;
    Ok(())
}

/// Stop accepting, let requests in flight finish (up to `drain`), end the
/// remaining streams and sessions, then stop the upstreams and their children.
async fn drain_and_stop(
    state: &GatewayState,
    stop_accepting: tokio::sync::oneshot::Sender<()>,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    drain: Duration,
) {
    tracing::info!(
        in_flight = state.requests.in_flight(),
        drain_ms = drain.as_millis() as u64,
        "stopping: no new connections; draining requests in flight"
    );
    let _ = stop_accepting.send(());
    if !state.requests.wait_idle(drain).await {
        tracing::warn!(
            in_flight = state.requests.in_flight(),
            "drain deadline passed; stopping anyway"
        );
    }
    // Idle session streams (legacy GET) would otherwise hold the server open.
    shutdown.cancel();
    if tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the drain; closing them");
    }
    shutdown_upstreams(state).await;
    tracing::info!("stopped");
}

/// Resolves on SIGTERM or SIGINT. The handlers are in place when this
/// returns, so a signal that comes before the first poll is not lost to
/// the default action.
fn termination() -> anyhow::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = interrupt.recv() => {},
        }
    })
}

/// The caller a command-line token names, as `/mcp` would see it.
async fn cli_caller(started: &Started, token: Option<String>) -> anyhow::Result<Caller> {
    let token = token.filter(|t| !t.trim().is_empty());
    Ok(match token {
        Some(token)
            if token.starts_with(manifold_store::TOKEN_PREFIX) || started.state.auth.required =>
        {
            started
                .state
                .governance()
                .authenticate(token.trim())
                .await
                .map_err(|e| anyhow::anyhow!("gateway token refused: {}", e.reason()))?
        }
        Some(other) => Caller::unauthenticated(manifold_server::principal_from_token(Some(&other))),
        None if started.state.auth.required => {
            anyhow::bail!("auth is required: set MANIFOLD_TOKEN to a gateway token")
        }
        None => Caller::anonymous(),
    })
}

pub async fn stdio(path: &Path, token: Option<String>) -> anyhow::Result<()> {
    let started = start(path, None).await?;
    let caller = cli_caller(&started, token).await?;
    let terminated = termination()?;
    let result = tokio::select! {
        r = manifold_server::serve_stdio(Arc::clone(&started.state), caller) => r,
        () = terminated => Ok(()),
    };
    shutdown_upstreams(&started.state).await;
    result
}

pub async fn catalog_stats(path: &Path, json: bool) -> anyhow::Result<()> {
    let started = start(path, None).await?;
    let view = started.state.catalog.view(&Principal::anonymous()).await;
    let statuses = started.state.catalog.statuses();
    let meta_tokens: usize = manifold_server::meta_tools_for(started.state.code_mode().is_some())
        .iter()
        .map(|t| manifold_catalog::count_tokens(&serde_json::to_string(t).expect("serializes")))
        .sum();
    if json {
        let servers: Vec<_> = statuses
            .iter()
            .map(|(status, enabled)| {
                let sv = view.server(&status.name);
                serde_json::json!({
                    "name": status.name,
                    "enabled": enabled,
                    "status": status,
                    "tools": sv.map_or(0, |s| s.tools.len()),
                    "definition_tokens": sv.map_or(0, |s| s.tools.iter().map(|t| t.tokens()).sum::<usize>()),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "servers": servers,
                "decision": started.decision,
                "meta_tool_tokens": meta_tokens,
            }))?
        );
    } else {
        println!("{:<28} {:>6} {:>8}  state", "server", "tools", "tokens");
        for (status, enabled) in &statuses {
            let sv = view.server(&status.name);
            let state = match (&status.state, enabled) {
                (_, false) => "not enabled".to_string(),
                (UpstreamState::Failed(r), _) => format!("failed: {r}"),
                (s, _) => format!("{s:?}").to_lowercase(),
            };
            println!(
                "{:<28} {:>6} {:>8}  {}",
                status.name,
                sv.map_or(0, |s| s.tools.len()),
                sv.map_or(0, |s| s.tools.iter().map(|t| t.tokens()).sum::<usize>()),
                state
            );
        }
        let d = &started.decision;
        println!(
            "\n{} servers, {} tools, {} definition tokens (o200k); threshold {} tokens; mode {:?} → {:?}; meta-tools cost {} tokens",
            statuses.len(),
            d.tools,
            d.definition_tokens,
            d.threshold_tokens,
            d.configured,
            d.chosen,
            meta_tokens
        );
    }
    shutdown_upstreams(&started.state).await;
    Ok(())
}

/// `manifold export`: the caller's visible catalog as a provider `tools`
/// array, printed as JSON (the same document as `GET /export`).
pub async fn export(
    path: &Path,
    format: manifold_export::Provider,
    token: Option<String>,
) -> anyhow::Result<()> {
    let started = start(path, None).await?;
    let result = async {
        let caller = cli_caller(&started, token).await?;
        let export = manifold_server::provider::export::export(&started.state, &caller, format)
            .await
            .map_err(|e| anyhow::anyhow!("export refused: {e}"))?;
        println!("{}", serde_json::to_string_pretty(&export)?);
        // What deferral saves, on stderr: the tools the model sees up front
        // against the same catalog sent in full (o200k tokens).
        let count = |tools: &[serde_json::Value]| {
            manifold_catalog::count_tokens(&serde_json::to_string(tools).expect("serializes"))
        };
        let mut all_hot = started.config.export.clone();
        all_hot.hot_tools = export.names.iter().map(|n| n.qualified.clone()).collect();
        let full = manifold_server::provider::export::export_with(
            &started.state,
            &caller,
            format,
            &all_hot,
        )
        .await
        .map_err(|e| anyhow::anyhow!("export refused: {e}"))?;
        eprintln!(
            "{} tools; up front {} tokens with deferred loading, {} tokens sent in full (o200k)",
            export.names.len(),
            count(&manifold_export::upfront(&export.tools)),
            count(&full.tools),
        );
        anyhow::Ok(())
    }
    .await;
    shutdown_upstreams(&started.state).await;
    result
}
