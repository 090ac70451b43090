//! Wiring: config → upstreams → catalog → broker → surface.

use std::{path::Path, sync::Arc, time::Duration};

use anyhow::Context;
use manifold_broker::{Caller, Governance};
use manifold_catalog::{Principal, ToolCatalog};
use manifold_server::{AuthConfig, GatewayState, ModeDecision, SurfaceConfig, decide_mode};
use manifold_store::Store;
use manifold_upstream::{Upstream, UpstreamState};
use tokio_util::sync::CancellationToken;

use crate::config::Config;

/// A started gateway: upstreams connected, catalog listed, mode decided.
pub struct Started {
    pub state: Arc<GatewayState>,
    pub decision: ModeDecision,
    pub config: Config,
}

/// `listen`: where HTTP will listen (decides whether auth is on by
/// default); `None` for stdio and offline commands.
pub async fn start(path: &Path, listen: Option<&str>) -> anyhow::Result<Started> {
    let config = Config::load(path)?;
    let store = config.open_store().await?;
    seed_policies(&store, &config).await?;
    let governance = Governance::new(store, config.governance_config()?);
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
    };
    let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
    let upstreams = config
        .servers
        .iter()
        .map(|s| Upstream::new(s.clone(), events_tx.clone()))
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
                state.announce(&event).await;
            }
        });
    });
    catalog.connect_enabled().await;
    // The mode is decided once, at start: switching later would change the
    // client's tools array mid-conversation and break its prompt cache.
    let view = catalog.view(&Principal::anonymous()).await;
    let decision = decide_mode(
        config.gateway.mode,
        &view,
        config.gateway.context_window_tokens,
        config.gateway.threshold_percent,
    );
    let surface = SurfaceConfig {
        mode: decision.chosen,
        strategy: config.gateway.search_strategy,
        admission: config.admission.to_config(),
        export: config.export.clone(),
        ..SurfaceConfig::default()
    };
    let state = GatewayState::new(catalog, surface, governance, auth);
    if config.code_mode.enabled {
        let sandbox = crate::sandbox::start(&config.code_mode).await?;
        state.enable_code_mode(manifold_codemode::CodeMode::new(
            sandbox,
            Arc::clone(&state.broker),
            config.code_mode.limits(),
        ));
    }
    let _ = state_tx.send(Some(Arc::clone(&state)));
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
    })
}

async fn shutdown_upstreams(state: &GatewayState) {
    for upstream in state.catalog.upstreams() {
        upstream.disconnect().await;
    }
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
fn spawn_sweeps(governance: Arc<Governance>, every: Duration) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        loop {
            ticks.tick().await;
            match governance.sweep().await {
                Ok(report) => {
                    let tokens: usize = report.token_passes.iter().sum();
                    if tokens + report.approvals as usize + report.windows as usize > 0 {
                        tracing::info!(
                            tokens,
                            passes = report.token_passes.len(),
                            approvals = report.approvals,
                            windows = report.windows,
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
    let started = start(path, Some(&listen)).await?;
    let shutdown = CancellationToken::new();
    let app = manifold_server::http::router(
        Arc::clone(&started.state),
        started.config.gateway.allowed_hosts.clone(),
        started.config.gateway.legacy_sessions,
        shutdown.clone(),
    );
    let app = app.merge(metrics_route()?);
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let local = listener.local_addr()?;
    // Tests and scripts read this line to find the port.
    eprintln!("manifold listening on http://{local}/mcp");
    tracing::info!(%local, "serving /mcp");
    let token = shutdown.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            wait_for_signal().await;
            token.cancel();
        })
        .await?;
    shutdown_upstreams(&started.state).await;
    Ok(())
}

/// Prometheus text at `/metrics`: discovery queue depth, active listings and
/// refusals so far.
fn metrics_route() -> anyhow::Result<axum::Router> {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    for (name, help) in [
        (
            "manifold_discovery_queue_depth",
            "Discovery requests waiting for a slot",
        ),
        ("manifold_discovery_active", "Discovery requests running"),
    ] {
        metrics::describe_gauge!(name, help);
        metrics::gauge!(name).set(0.0);
    }
    metrics::describe_counter!(
        "manifold_discovery_refusals_total",
        "Discovery requests refused with 503 tool_discovery_busy"
    );
    metrics::counter!("manifold_discovery_refusals_total").absolute(0);
    Ok(axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || std::future::ready(handle.render())),
    ))
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
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
    let result = tokio::select! {
        r = manifold_server::serve_stdio(Arc::clone(&started.state), caller) => r,
        _ = wait_for_signal() => Ok(()),
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
        let export = manifold_server::export::export(&started.state, &caller, format)
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
        let full = manifold_server::export::export_with(&started.state, &caller, format, &all_hot)
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
