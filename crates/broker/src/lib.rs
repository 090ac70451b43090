//! The broker: the one path from any surface to an upstream.
//!
//! Every tool call (the `call_tool` meta-tool, direct-mode calls, code mode,
//! `POST /call`) goes through [`Broker::call`] (`call.rs`), in this order:
//! resolve the name in the caller's view, decide with [`Governance`]
//! whether the call may go ahead (token, quarantine, policy, rate limits,
//! the taint rule, approval), validate the arguments against the tool's
//! `inputSchema`, forward it under the server's timeout and concurrency
//! cap, guard the result (secret masking, size limits) and record one
//! activity row whatever happened.
//!
//! Every other request that reaches an upstream for a caller (prompts,
//! resources, completions, subscriptions, a caller's own server switches)
//! is decided by the broker too and sent with the [`Allowed`] it returned
//! (`door.rs`). Only the broker makes an `Allowed`.
//!
//! The modules:
//! - `call.rs`: a tool call, step by step;
//! - `door.rs`: the decisions for every other request, and their sending;
//! - `governance/`: who the caller is and what it may see and do;
//! - `audit.rs`: the audit rows of all of it, through the store's writer;
//! - `snapshot.rs`: the governance state decisions read, kept in memory;
//! - `policy.rs`: how policies and quarantine rules evaluate;
//! - `validate.rs`: arguments against a tool's `inputSchema`;
//! - `guardrails.rs`: secret masking and the size limit on results;
//! - `returned.rs`: the same guard, and an activity row, for every other
//!   answer: prompts, resources, completions, upstream errors;
//! - `detach.rs`: a call that finishes even if its caller goes away;
//! - `tasks.rs`: `tasks/*` requests and the tasks upstreams make;
//! - `gateway_tasks.rs`: long calls the gateway turns into tasks itself.

mod audit;
mod call;
mod detach;
mod door;
mod failure_rows;
mod gateway_tasks;
mod governance;
pub mod guardrails;
pub mod policy;
mod returned;
mod snapshot;
mod tasks;
mod validate;

use std::sync::Arc;

use manifold_catalog::{PrimitiveCatalog, ToolCatalog};
use manifold_upstream::UpstreamError;

pub use audit::AuditUnavailable;
pub use call::CallRequest;
pub use door::Allowed;
pub use gateway_tasks::GatewayTaskSettings;
pub use governance::{
    Governance,
    authorize::Authorized,
    caller::{Caller, Provenance, UserGrant},
    config::{AuditFailure, DEFAULT_AUDIT_RETENTION_DAYS, GovernanceConfig},
    refusal::Refusal,
    rules::{RequestKind, Rules, Subject},
    sweep::SweepReport,
    visible::Visible,
};
pub use policy::QuarantineRules;
pub use snapshot::{POSTGRES_WATCH, SQLITE_WATCH};
pub use validate::ArgumentValidator;

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// `name` as the caller gave it; shown cut, as the audit keeps it.
    #[error(
        "unknown tool '{}'",
        manifold_store::cut_text(name, manifold_store::MAX_STORED_NAME_BYTES)
    )]
    UnknownTool { name: String },
    /// A prompt, resource or server no upstream has.
    #[error("unknown {what} '{name}'")]
    Unknown { what: &'static str, name: String },
    #[error("invalid arguments for '{tool}': {}", violations.join("; "))]
    InvalidArguments {
        tool: String,
        violations: Vec<String>,
    },
    #[error("{0}")]
    Refused(#[from] Refusal),
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error(transparent)]
    AuditUnavailable(#[from] audit::AuditUnavailable),
}

pub struct Broker {
    catalog: Arc<ToolCatalog>,
    /// Prompts and resources of the same upstreams; private, so that only
    /// the broker finds the upstream a request goes to.
    primitives: PrimitiveCatalog,
    governance: Arc<Governance>,
    validator: ArgumentValidator,
    /// This replica's stable id, set once at start (`set_replica`).
    replica: std::sync::OnceLock<String>,
    /// Set once when long calls may become tasks the gateway makes.
    gateway_tasks: std::sync::OnceLock<GatewayTaskSettings>,
    running_tasks: gateway_tasks::Running,
}

impl Broker {
    pub fn new(catalog: Arc<ToolCatalog>, governance: Arc<Governance>) -> Arc<Self> {
        Arc::new(Self {
            primitives: PrimitiveCatalog::new(Arc::clone(&catalog)),
            catalog,
            governance,
            validator: ArgumentValidator::default(),
            replica: std::sync::OnceLock::new(),
            gateway_tasks: std::sync::OnceLock::new(),
            running_tasks: Default::default(),
        })
    }

    pub fn catalog(&self) -> &Arc<ToolCatalog> {
        &self.catalog
    }

    pub fn governance(&self) -> &Arc<Governance> {
        &self.governance
    }

    /// Names this replica: the tasks made through it are marked with the
    /// id. Set before `enable_gateway_tasks`; a later call changes nothing.
    pub fn set_replica(&self, id: String) {
        let _ = self.replica.set(id);
    }

    pub(crate) fn replica(&self) -> Option<&str> {
        self.replica.get().map(String::as_str)
    }
}
