//! Wiring: config → upstreams → catalog → broker → surface.

use std::{path::Path, sync::Arc};

use anyhow::Context;
use manifold_catalog::{Principal, ToolCatalog};
use manifold_server::{GatewayState, ModeDecision, SurfaceConfig, decide_mode};
use manifold_upstream::{Upstream, UpstreamState};
use tokio_util::sync::CancellationToken;

use crate::config::Config;

/// A started gateway: upstreams connected, catalog listed, mode decided.
pub struct Started {
    pub state: Arc<GatewayState>,
    pub decision: ModeDecision,
    pub config: Config,
}

pub async fn start(path: &Path) -> anyhow::Result<Started> {
    let config = Config::load(path)?;
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
        ..SurfaceConfig::default()
    };
    let state = GatewayState::new(catalog, surface);
    let _ = state_tx.send(Some(Arc::clone(&state)));
    tracing::info!(
        tools = decision.tools,
        definition_tokens = decision.definition_tokens,
        threshold_tokens = decision.threshold_tokens,
        mode = ?decision.chosen,
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

pub async fn serve(path: &Path, listen: Option<String>) -> anyhow::Result<()> {
    let started = start(path).await?;
    let listen = listen.unwrap_or_else(|| started.config.gateway.listen.clone());
    let shutdown = CancellationToken::new();
    let app = manifold_server::http::router(
        Arc::clone(&started.state),
        started.config.gateway.allowed_hosts.clone(),
        started.config.gateway.legacy_sessions,
        shutdown.clone(),
    );
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

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

pub async fn stdio(path: &Path, token: Option<String>) -> anyhow::Result<()> {
    let started = start(path).await?;
    let principal = manifold_server::principal_from_token(token.as_deref());
    let result = tokio::select! {
        r = manifold_server::serve_stdio(Arc::clone(&started.state), principal) => r,
        _ = wait_for_signal() => Ok(()),
    };
    shutdown_upstreams(&started.state).await;
    result
}

pub async fn catalog_stats(path: &Path, json: bool) -> anyhow::Result<()> {
    let started = start(path).await?;
    let view = started.state.catalog.view(&Principal::anonymous()).await;
    let statuses = started.state.catalog.statuses();
    let meta_tokens: usize = manifold_server::meta_tools()
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
