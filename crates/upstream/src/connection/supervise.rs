//! Supervising a server's own connection: connecting, noticing when it is
//! lost, restarting it with backoff, closing it on purpose, and the state
//! that status snapshots and the catalog see.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use rmcp::{RoleClient, service::Peer};

use super::{Upstream, UpstreamState, open::Live};
use crate::{UpstreamError, UpstreamEvent};

/// How often an OpenAPI document's file is looked at, as the config's is.
const DOCUMENT_POLL: Duration = Duration::from_secs(1);

impl Upstream {
    fn set_state(&self, state: UpstreamState, live: Option<&Live>) {
        let up = matches!(state, UpstreamState::Connected);
        metrics::gauge!("manifold_upstream_up", "server" => self.config.name.clone()).set(if up {
            1.0
        } else {
            0.0
        });
        {
            let mut guard = self.state.lock().expect("state lock");
            guard.0 = state;
            if let Some(live) = live {
                guard.1 = Some(live.era);
                guard.2 = Some(live.protocol_version.clone());
                guard.3 = live.pid;
                guard.4 = live.transport.or(guard.4);
            } else {
                guard.3 = None;
            }
        }
        let _ = self.events.send(UpstreamEvent::StateChanged {
            server: self.config.name.clone(),
        });
    }

    /// Connect if not connected. Idempotent; concurrent callers share one attempt.
    pub async fn connect(self: &Arc<Self>) -> Result<(), UpstreamError> {
        self.disabled.store(false, Ordering::SeqCst);
        self.connect_inner().await
    }

    async fn connect_inner(self: &Arc<Self>) -> Result<(), UpstreamError> {
        if self.principals.is_some() {
            // Nothing to open until a caller comes: each opens its own.
            if self.oauth.vault().is_none() {
                return Err(UpstreamError::Connect {
                    server: self.config.name.clone(),
                    reason: "no OAuth vault in this process".into(),
                });
            }
            self.set_state(UpstreamState::Connected, None);
            return Ok(());
        }
        if let Some(openapi) = &self.openapi {
            let loaded_now = self.load_openapi(openapi).await?;
            if let Some(path) = super::openapi::OpenApi::document_file(&self.config)
                && loaded_now
            {
                self.spawn_document_watch(path, openapi.generation());
            }
            return Ok(());
        }
        let Some(mut slot) = self.connection.vacant().await else {
            return Ok(());
        };
        self.set_state(UpstreamState::Connecting, None);
        let opened = self.connection.open(None, &self.events, &self.oauth).await;
        match opened {
            Ok(live) => {
                *self.capabilities.lock().expect("capabilities lock") = live
                    .peer()
                    .peer_info()
                    .map(|info| info.capabilities.clone());
                self.set_state(UpstreamState::Connected, Some(&live));
                let generation = live.generation;
                let peer = live.peer().clone();
                *slot = Some(live);
                self.spawn_watch(generation, peer);
                Ok(())
            }
            Err(error) => {
                self.set_state(UpstreamState::Failed(error.to_string()), None);
                Err(error)
            }
        }
    }

    /// An OpenAPI server is connected once its document is read; true when
    /// this call read it.
    async fn load_openapi(&self, openapi: &super::openapi::OpenApi) -> Result<bool, UpstreamError> {
        if openapi.is_loaded() {
            return Ok(false);
        }
        self.set_state(UpstreamState::Connecting, None);
        match openapi.load(&self.config).await {
            Ok(_) => {
                *self.capabilities.lock().expect("capabilities lock") =
                    Some(super::openapi::OpenApi::capabilities());
                self.set_state(UpstreamState::Connected, None);
                Ok(true)
            }
            Err(error) => {
                self.set_state(UpstreamState::Failed(error.to_string()), None);
                Err(error)
            }
        }
    }

    /// Watches an OpenAPI document's file as the config is watched: when
    /// it changes, the document is read again and, if its tools changed,
    /// callers hear `list_changed`. Ends with the read it belongs to.
    fn spawn_document_watch(self: &Arc<Self>, path: std::path::PathBuf, generation: u64) {
        let stamp = |path: &std::path::Path| {
            let meta = std::fs::metadata(path).ok()?;
            Some((meta.modified().ok()?, meta.len()))
        };
        let this = Arc::downgrade(self);
        // Taken now, not when the task first runs: a change made meanwhile
        // must count as one.
        let mut seen = stamp(&path);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(DOCUMENT_POLL);
            loop {
                ticks.tick().await;
                let Some(this) = this.upgrade() else { return };
                let Some(openapi) = &this.openapi else { return };
                if openapi.generation() != generation {
                    return;
                }
                let now = stamp(&path);
                if now == seen {
                    continue;
                }
                seen = now;
                tracing::info!(server = %this.config.name, "OpenAPI document changed: reading it again");
                openapi.expire();
                if let Err(error) = this.list_tools().await {
                    tracing::warn!(server = %this.config.name, %error, "changed OpenAPI document not read; the last tools stay");
                }
            }
        });
    }

    /// Watch one connection: notice when the transport dies and restart
    /// with backoff.
    fn spawn_watch(self: &Arc<Self>, generation: u64, peer: Peer<RoleClient>) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if this.connection.current_generation().await != Some(generation) {
                    return; // replaced or disconnected on purpose
                }
                if peer.is_transport_closed() {
                    break;
                }
            }
            this.on_connection_lost(generation).await;
        });
    }

    async fn on_connection_lost(self: &Arc<Self>, generation: u64) {
        if !self.connection.close_if(generation).await {
            return;
        }
        self.set_state(UpstreamState::Failed("connection lost".to_string()), None);
        tracing::warn!(server = %self.config.name, "upstream connection lost");
        if !self.config.restart {
            return;
        }
        let mut backoff = Duration::from_millis(200);
        loop {
            if self.disabled.load(Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep(backoff).await;
            if self.disabled.load(Ordering::SeqCst) {
                return;
            }
            self.restarts.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("manifold_upstream_restarts_total", "server" => self.config.name.clone())
                .increment(1);
            match self.connect_inner().await {
                Ok(()) => {
                    tracing::info!(server = %self.config.name, "upstream restarted");
                    let _ = self.events.send(UpstreamEvent::ToolsChanged {
                        server: self.config.name.clone(),
                    });
                    return;
                }
                Err(e) => {
                    tracing::warn!(server = %self.config.name, error = %e, "restart failed");
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
    }

    /// Close the connection on purpose; no restart follows.
    pub async fn disconnect(&self) {
        self.disabled.store(true, Ordering::SeqCst);
        if let Some(principals) = &self.principals {
            principals.close_all();
        }
        self.connection.close().await;
        if let Some(openapi) = &self.openapi {
            openapi.unload();
        }
        self.set_state(UpstreamState::NotConnected, None);
    }

    /// Waits until no forwarded request holds a call permit (at most
    /// `timeout`), then disconnects. A server a reload removed or replaced
    /// finishes the calls it already has on its own connection.
    pub async fn retire(&self, timeout: Duration) {
        self.connection.drain(timeout).await;
        self.disconnect().await;
    }
}
