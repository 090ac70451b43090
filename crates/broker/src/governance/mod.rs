//! Governance on the broker's path: who the caller is, what they may see,
//! whether a request may go ahead, and the audit of all three.
//!
//! Decisions read tokens, groups, policies and classifications from the
//! governance snapshot (`snapshot.rs`), which a governance write replaces:
//! at once in this process, within tens of milliseconds from another (see
//! there for the bounds). Rate counters and approvals are read from the
//! store when a rule needs them. Audit rows go through the store's audit
//! writer (`audit.rs`). When the store cannot be read, the answer is no.
//!
//! By job:
//! - `caller.rs`: who is calling, and what a code-mode run has read;
//! - `authenticate.rs`: a bearer or a verified user becomes a caller;
//! - `visible.rs`: what a caller may see of a view;
//! - `authorize.rs`: whether a tool call may go ahead;
//! - `rules.rs`: the same for every other request that reaches an upstream;
//! - `approvals.rs`: filing, waiting for and consuming an approval;
//! - `refusal.rs`: why a request was refused;
//! - `sweep.rs`: the periodic cleanup;
//! - `config.rs`: the settings.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use manifold_catalog::CatalogTool;
use manifold_store::{AuditWriter, Notice, RiskTier, Store, StoreEvent, ToolClassification};

use crate::{
    policy::{QuarantineReason, effective_tier},
    snapshot::{Snapshot, Snapshots},
};
use config::GovernanceConfig;

mod approvals;
mod authenticate;
pub(crate) mod authorize;
pub(crate) mod caller;
pub(crate) mod config;
pub(crate) mod refusal;
pub(crate) mod rules;
pub(crate) mod sweep;
pub(crate) mod visible;

/// Governance: the store plus the rules for reading it.
pub struct Governance {
    store: Store,
    pub(crate) config: GovernanceConfig,
    /// Starts as `config.untrusted_servers`; a config reload replaces it.
    untrusted: std::sync::RwLock<BTreeSet<String>>,
    http: reqwest::Client,
    /// Woken when some process decided an approval (a store event), so a
    /// waiting call re-reads at once instead of at its next poll.
    approvals_decided: tokio::sync::Notify,
    snapshots: Snapshots,
    pub(crate) audit: AuditWriter,
    pub(crate) failure_rows: crate::failure_rows::FailureRows,
    /// Set while audit rows cannot be made durable (`audit_failure = "refuse"`).
    pub(crate) audit_down: std::sync::atomic::AtomicBool,
}

impl Governance {
    pub fn new(store: Store, config: GovernanceConfig) -> Arc<Governance> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("an HTTP client with a timeout builds");
        let governance = Arc::new(Governance {
            snapshots: Snapshots::new(store.clone()),
            audit: AuditWriter::start(store.clone(), config.audit_commit),
            failure_rows: crate::failure_rows::FailureRows::new(config.failure_rows_per_minute),
            audit_down: Default::default(),
            store,
            untrusted: std::sync::RwLock::new(config.untrusted_servers.clone()),
            config,
            http,
            approvals_decided: tokio::sync::Notify::new(),
        });
        Snapshots::spawn_watch(Arc::downgrade(&governance), |g: &Governance| &g.snapshots);
        governance
    }

    /// Governance may have changed in another process (an event, a lost
    /// listener): the next decision reads afresh.
    pub fn invalidate(&self) {
        self.snapshots.invalidate();
    }

    /// Applies what another process said, as far as governance keeps it in
    /// memory: a decided approval wakes the calls waiting for one; a
    /// governance change (or events lost with a listener connection) drops
    /// the snapshot.
    pub fn heard(&self, notice: &Notice) {
        match notice {
            Notice::Event {
                event: StoreEvent::ApprovalDecided { .. },
                ..
            } => self.approval_decided(),
            Notice::Event {
                event: StoreEvent::GovernanceChanged,
                ..
            } => self.invalidate(),
            Notice::Missed => {
                self.approval_decided();
                self.invalidate();
            }
            Notice::Event { .. } => {}
        }
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshots.current()
    }

    /// Some approval was decided, here or in another process: every
    /// waiting call re-reads its own.
    pub fn approval_decided(&self) {
        self.approvals_decided.notify_waiters();
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The tier policy treats `tool` as: the operator's classification,
    /// else the upstream's hints, except that an `untrusted` server's hints
    /// never lower a tool below destructive.
    pub fn tier_of(&self, tool: &CatalogTool, class: Option<&ToolClassification>) -> RiskTier {
        if self.is_untrusted(&tool.server) {
            return class.and_then(|c| c.tier).unwrap_or(RiskTier::Destructive);
        }
        effective_tier(tool, class)
    }

    /// Why `tool` is held back, if it is.
    pub fn quarantine_reason(
        &self,
        tool: &CatalogTool,
        class: Option<&ToolClassification>,
    ) -> Option<QuarantineReason> {
        self.config
            .quarantine
            .check(tool, class, self.is_untrusted(&tool.server))
    }

    pub fn is_untrusted(&self, server: &str) -> bool {
        self.untrusted
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(server)
    }

    /// The servers marked `untrusted` after a config reload.
    pub fn set_untrusted(&self, servers: BTreeSet<String>) {
        *self.untrusted.write().unwrap_or_else(|p| p.into_inner()) = servers;
    }

    pub fn config(&self) -> &GovernanceConfig {
        &self.config
    }
}
