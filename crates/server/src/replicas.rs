//! What one gateway process tells the others that share its PostgreSQL
//! store, and what it does when they tell it something.
//!
//! What a process keeps in memory is its catalog (which servers are
//! enabled, cached listings), its governance snapshot (tokens, groups,
//! policies, classifications) and the calls waiting for an approval; events
//! keep those in step. Rate counters and approvals are read from the store.

use manifold_catalog::Principal;
use manifold_store::{Notice, StoreEvent, Subscription};
use manifold_upstream::UpstreamEvent;

use crate::GatewayState;

impl GatewayState {
    /// Tells the other processes about a change made here (nothing on
    /// SQLite).
    pub async fn publish(&self, event: StoreEvent) {
        self.governance().store().publish(event).await;
    }
}

/// Applies events from other processes until the subscription ends.
pub async fn follow(state: std::sync::Arc<GatewayState>, mut events: Subscription) {
    while let Some(notice) = events.recv().await {
        apply(&state, notice).await;
    }
}

/// Brings this process's memory in line with one notice.
pub async fn apply(state: &GatewayState, notice: Notice) {
    state.governance().heard(&notice);
    match notice {
        // This process made that change itself.
        Notice::Event { own: true, .. } => {}
        Notice::Event {
            event: StoreEvent::ServerSwitched { server, enabled },
            ..
        } => switch_server(state, &server, enabled).await,
        Notice::Event {
            event: StoreEvent::ToolsChanged { server },
            ..
        } => {
            state.catalog.invalidate(&server);
            state
                .announce(&UpstreamEvent::ToolsChanged { server })
                .await;
        }
        Notice::Event {
            event: StoreEvent::GatewayTaskCancelled { id },
            ..
        } => state.broker.gateway_task_cancelled(&id),
        // Governance's part was done above.
        Notice::Event {
            event: StoreEvent::ApprovalDecided { .. } | StoreEvent::GovernanceChanged,
            ..
        } => {}
        // Events may have been lost: re-list every server on next use, and
        // stop the calls whose tasks were cancelled meanwhile.
        Notice::Missed => {
            for upstream in state.catalog.upstreams() {
                state.catalog.invalidate(upstream.name());
            }
            let cancelled = state.broker.recheck_cancelled_gateway_tasks().await;
            if cancelled > 0 {
                tracing::info!(
                    cancelled,
                    "gateway tasks cancelled while events were missed"
                );
            }
        }
    }
}

async fn switch_server(state: &GatewayState, server: &str, enabled: bool) {
    if state.catalog.upstream(server).is_none() {
        tracing::warn!(%server, "another replica switched a server this one does not have; check that every replica runs the same [[servers]]");
        return;
    }
    if state.catalog.is_enabled(server) == enabled {
        return;
    }
    let result = if enabled {
        state
            .catalog
            .enable(server, &Principal::anonymous())
            .await
            .map(|_| ())
    } else {
        state.catalog.disable(server).await
    };
    match result {
        Ok(()) => {
            tracing::info!(%server, enabled, "server switched by another replica");
            state
                .announce(&UpstreamEvent::ToolsChanged {
                    server: server.to_string(),
                })
                .await;
        }
        Err(error) => {
            tracing::warn!(%server, enabled, %error, "cannot follow another replica's server switch")
        }
    }
}
