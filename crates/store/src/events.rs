//! Events between gateway processes that share one PostgreSQL database.
//!
//! The store holds the truth; an event only says "look again, now". A
//! process publishes with `pg_notify` on [`EVENTS_CHANNEL`] and every
//! process (itself included) that subscribed hears it through its own
//! `LISTEN` connection. Notifications are not durable: a listener whose
//! connection dropped gets [`Notice::Missed`] once it is back, and must
//! re-read whatever it keeps in memory. On SQLite (one process) publishing
//! does nothing and there is nothing to subscribe to.

use serde::{Deserialize, Serialize};
use sqlx::postgres::PgListener;
use tokio::sync::mpsc;

use crate::{Backend, Result, Store};

/// The PostgreSQL channel every gateway process listens on.
pub const EVENTS_CHANNEL: &str = "manifold_events";

/// Something one process changed that others may hold in memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StoreEvent {
    /// An approval was approved or denied: calls waiting for it re-read it.
    ApprovalDecided { id: String },
    /// An operator switched a server for everyone (admin API) on some
    /// replica. A caller's own `enable_server`/`disable_server` is not one.
    ServerSwitched { server: String, enabled: bool },
    /// An upstream told some replica that its tool list changed.
    ToolsChanged { server: String },
    /// Tokens, groups, policies or classifications changed. Published by a
    /// trigger in the database (`from` is "database"), so writes from any
    /// process, the CLI included, are heard.
    GovernanceChanged,
    /// A gateway-made task's owner asked it to stop: the replica running
    /// its call cancels it.
    GatewayTaskCancelled { id: String },
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    /// The publishing store's instance id.
    from: String,
    #[serde(flatten)]
    event: StoreEvent,
}

/// What a subscriber hears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    Event {
        event: StoreEvent,
        /// Published by this very store (this process).
        own: bool,
    },
    /// The listening connection was lost and is back: events published
    /// meanwhile are gone, so in-memory state must be re-read.
    Missed,
}

/// A live subscription; the listener task ends when this is dropped.
pub struct Subscription {
    notices: mpsc::Receiver<Notice>,
    task: tokio::task::JoinHandle<()>,
}

impl Subscription {
    /// The next notice; `None` once the listener has stopped for good.
    pub async fn recv(&mut self) -> Option<Notice> {
        self.notices.recv().await
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Store {
    /// Tells every subscribed process about `event` (PostgreSQL); does
    /// nothing on SQLite. Delivery is best effort: a failure is logged, and
    /// the other processes' periodic re-reads cover it.
    pub async fn publish(&self, event: StoreEvent) {
        if self.backend != Backend::Postgres {
            return;
        }
        let payload = Envelope {
            from: self.instance.to_string(),
            event,
        };
        let payload = serde_json::to_string(&payload).expect("events serialize");
        let sent = self
            .query("SELECT pg_notify($1, $2)")
            .bind(EVENTS_CHANNEL)
            .bind(payload)
            .execute(self.pool())
            .await;
        if let Err(error) = sent {
            tracing::warn!(%error, "event not published");
        }
    }

    /// Starts listening for events (PostgreSQL). `None` on SQLite, where a
    /// single process needs none.
    pub async fn subscribe(&self) -> Result<Option<Subscription>> {
        if self.backend != Backend::Postgres {
            return Ok(None);
        }
        let mut listener = PgListener::connect(&self.url.0).await?;
        listener.listen(EVENTS_CHANNEL).await?;
        let (tx, notices) = mpsc::channel(256);
        let instance = self.instance.to_string();
        let task = tokio::spawn(async move {
            loop {
                let notice = match listener.try_recv().await {
                    Ok(Some(notification)) => {
                        match serde_json::from_str::<Envelope>(notification.payload()) {
                            Ok(envelope) => Notice::Event {
                                own: envelope.from == instance,
                                event: envelope.event,
                            },
                            Err(error) => {
                                tracing::warn!(%error, "unreadable event ignored");
                                continue;
                            }
                        }
                    }
                    // The connection dropped; the next try_recv reconnects
                    // and re-issues LISTEN.
                    Ok(None) => Notice::Missed,
                    // Reconnecting failed: the database is away. Waiting
                    // calls keep polling it; try again shortly.
                    Err(error) => {
                        tracing::warn!(%error, "event listener cannot reconnect; retrying in 1 s");
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                        continue;
                    }
                };
                if tx.send(notice).await.is_err() {
                    return;
                }
            }
        });
        Ok(Some(Subscription { notices, task }))
    }
}
