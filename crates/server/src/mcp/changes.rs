//! Telling downstream clients that a list (or a subscribed resource) changed,
//! in both protocol eras.
//!
//! A legacy (initialize) session hears of changes as plain notifications on its
//! session; a 2026-07-28 client only on a `subscriptions/listen` stream. The hub
//! keeps the legacy sessions and a broadcast channel that listen streams follow,
//! so one upstream event reaches both kinds of client.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex, Weak},
};

use manifold_upstream::UpstreamEvent;
use rmcp::{
    ErrorData as McpError, RoleServer,
    model::SubscriptionFilter,
    service::{Peer, SubscriptionContext},
};
use tokio::sync::broadcast;

/// A change a downstream client may want to hear of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Tools,
    Prompts,
    Resources,
    ResourceUpdated(String),
}

impl Change {
    /// The downstream change an upstream event amounts to, if any.
    pub fn from_event(event: &UpstreamEvent) -> Option<Self> {
        match event {
            UpstreamEvent::ToolsChanged { .. } => Some(Change::Tools),
            UpstreamEvent::PromptsChanged { .. } => Some(Change::Prompts),
            UpstreamEvent::ResourcesChanged { .. } => Some(Change::Resources),
            UpstreamEvent::ResourceUpdated { uri, .. } => {
                Some(Change::ResourceUpdated(uri.clone()))
            }
            UpstreamEvent::StateChanged { .. } => None,
        }
    }
}

/// What one legacy session asked for.
#[derive(Debug, Default)]
pub struct SessionSubscriptions {
    uris: Mutex<BTreeSet<String>>,
}

impl SessionSubscriptions {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.uris.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn insert(&self, uri: &str) -> bool {
        self.lock().insert(uri.to_string())
    }

    pub fn remove(&self, uri: &str) -> bool {
        self.lock().remove(uri)
    }

    pub fn contains(&self, uri: &str) -> bool {
        self.lock().contains(uri)
    }
}

struct LegacySession {
    peer: Peer<RoleServer>,
    subscriptions: Weak<SessionSubscriptions>,
}

pub struct ChangeHub {
    sessions: Mutex<Vec<LegacySession>>,
    changes: broadcast::Sender<Change>,
}

impl Default for ChangeHub {
    fn default() -> Self {
        Self {
            sessions: Mutex::new(Vec::new()),
            changes: broadcast::channel(64).0,
        }
    }
}

impl ChangeHub {
    fn sessions(&self) -> std::sync::MutexGuard<'_, Vec<LegacySession>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers a legacy session (on `notifications/initialized`).
    pub fn register(&self, peer: Peer<RoleServer>, subscriptions: &Arc<SessionSubscriptions>) {
        let mut sessions = self.sessions();
        sessions.retain(|s| !s.peer.is_transport_closed() && s.subscriptions.strong_count() > 0);
        sessions.push(LegacySession {
            peer,
            subscriptions: Arc::downgrade(subscriptions),
        });
    }

    /// Tells every legacy session and every listen stream about `change`.
    pub async fn announce(&self, change: Change) {
        let targets: Vec<Peer<RoleServer>> = {
            let mut sessions = self.sessions();
            sessions
                .retain(|s| !s.peer.is_transport_closed() && s.subscriptions.strong_count() > 0);
            sessions
                .iter()
                .filter(|s| match &change {
                    Change::ResourceUpdated(uri) => s
                        .subscriptions
                        .upgrade()
                        .is_some_and(|subs| subs.contains(uri)),
                    _ => true,
                })
                .map(|s| s.peer.clone())
                .collect()
        };
        for peer in targets {
            let sent = match &change {
                Change::Tools => peer.notify_tool_list_changed().await,
                Change::Prompts => peer.notify_prompt_list_changed().await,
                Change::Resources => peer.notify_resource_list_changed().await,
                Change::ResourceUpdated(uri) => {
                    peer.notify_resource_updated(
                        rmcp::model::ResourceUpdatedNotificationParam::new(uri.clone()),
                    )
                    .await
                }
            };
            if let Err(error) = sent {
                tracing::debug!(%error, "change notification not delivered");
            }
        }
        // No receiver just means nobody is listening right now.
        let _ = self.changes.send(change);
    }

    /// Forwards changes to one `subscriptions/listen` stream until the client
    /// cancels it, sending only what the stream accepted, and updates only
    /// of the `readable` resources (those the broker let this caller use).
    pub async fn follow(
        &self,
        subscription: SubscriptionContext,
        readable: Vec<String>,
    ) -> Result<(), McpError> {
        let mut changes = self.changes.subscribe();
        loop {
            let change = tokio::select! {
                () = subscription.cancelled() => return Ok(()),
                change = changes.recv() => change,
            };
            let sink = subscription.sink();
            let accepted = sink.accepted();
            let sent = match change {
                Ok(Change::Tools) if accepted.tools_list_changed == Some(true) => {
                    sink.notify_tool_list_changed().await
                }
                Ok(Change::Prompts) if accepted.prompts_list_changed == Some(true) => {
                    sink.notify_prompt_list_changed().await
                }
                Ok(Change::Resources) if accepted.resources_list_changed == Some(true) => {
                    sink.notify_resource_list_changed().await
                }
                Ok(Change::ResourceUpdated(uri))
                    if readable.contains(&uri)
                        && accepted
                            .resource_subscriptions
                            .as_ref()
                            .is_some_and(|uris| uris.contains(&uri)) =>
                {
                    sink.notify_resource_updated(uri).await
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return Ok(()),
            };
            if sent.is_err() {
                // The stream is gone; ending the handler ends the subscription.
                return Ok(());
            }
        }
    }
}

/// The part of `requested` the gateway can serve: list changes of what it
/// exposes, and updates of resources (relayed from legacy upstreams).
pub fn accepted_filter(
    requested: &SubscriptionFilter,
    tools: bool,
    prompts: bool,
    resources: bool,
) -> SubscriptionFilter {
    let mut accepted = SubscriptionFilter::new();
    if tools && requested.tools_list_changed == Some(true) {
        accepted.tools_list_changed = Some(true);
    }
    if prompts && requested.prompts_list_changed == Some(true) {
        accepted.prompts_list_changed = Some(true);
    }
    if resources {
        if requested.resources_list_changed == Some(true) {
            accepted.resources_list_changed = Some(true);
        }
        accepted.resource_subscriptions = requested.resource_subscriptions.clone();
    }
    accepted
}
