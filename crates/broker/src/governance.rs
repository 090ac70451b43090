//! Governance on the broker's path: who the caller is, what they may see,
//! whether a call may go ahead, and the audit of all three.
//!
//! Decisions read tokens, groups, policies and classifications from the
//! governance snapshot (`snapshot.rs`), which a governance write replaces:
//! at once in this process, within tens of milliseconds from another (see
//! there for the bounds). Rate counters and approvals are read from the
//! store when a rule needs them. Audit rows go through the group-committing
//! writer. When the store cannot be read, the answer is no.

use std::{
    collections::{BTreeSet, HashSet},
    hash::{Hash, Hasher},
    sync::Arc,
    time::Duration,
};

use manifold_catalog::{CatalogTool, CatalogView, Principal};
use manifold_store::{
    AccessEvent, Action, ApprovalError, ApprovalStatus, AuditCommit, AuditRow, AuditWriter,
    AuthError, Decision, Effect, Notice, PolicyInputs, RequestRows, RiskTier, Store, StoreError,
    StoreEvent, TokenRecord, ToolClassification, ToolStatus, hash_argument_object, now_ms,
    token_id_of,
};
use manifold_upstream::CallContext;
use rmcp::model::JsonObject;
use serde_json::{Value, json};

use crate::{
    door::{RequestKind, Rules, Subject},
    policy::{
        self, QuarantineReason, QuarantineRules, classifications_by_tool, effective_tier, evaluate,
        hinted_tier,
    },
    snapshot::{Snapshot, Snapshots},
};

/// Who is calling, as authentication established it.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Private upstream listings are cached per this.
    pub principal: Principal,
    /// The name audit rows and approvals carry: `token:<id>`, or the
    /// principal's name for callers without a gateway token.
    pub name: String,
    pub token: Option<TokenRecord>,
    /// A caller signed in with the identity provider instead of a gateway
    /// token.
    pub user: Option<Arc<UserGrant>>,
    /// When the request was admitted: a token that expires later still
    /// finishes this request.
    pub admitted_at: i64,
}

/// What a verified access token from the identity provider grants: who the
/// user is, its groups (from the token's groups claim) and the actions its
/// OAuth scopes map to. Tool and server scoping come from policies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserGrant {
    /// The principal claim's value (`sub` by default).
    pub user: String,
    pub groups: Arc<BTreeSet<String>>,
    pub actions: BTreeSet<Action>,
    /// The token's `exp`, in Unix milliseconds.
    pub expires_at: i64,
}

impl Caller {
    pub fn anonymous() -> Caller {
        Caller::unauthenticated(Principal::anonymous())
    }

    /// A caller with no gateway token (auth off), known by an opaque
    /// principal such as a digest of its own bearer.
    pub fn unauthenticated(principal: Principal) -> Caller {
        Caller {
            name: principal.0.clone(),
            principal,
            token: None,
            user: None,
            admitted_at: now_ms(),
        }
    }

    /// A caller signed in with the identity provider: principal
    /// `user:<claim>`.
    pub fn with_user(grant: UserGrant) -> Caller {
        let name = format!("user:{}", grant.user);
        Caller {
            principal: Principal(name.clone()),
            name,
            token: None,
            user: Some(Arc::new(grant)),
            admitted_at: now_ms(),
        }
    }

    pub fn with_token(token: TokenRecord) -> Caller {
        let name = format!("token:{}", token.id);
        Caller {
            principal: Principal(name.clone()),
            name,
            token: Some(token),
            user: None,
            admitted_at: now_ms(),
        }
    }

    pub fn token_id(&self) -> Option<&str> {
        self.token.as_ref().map(|t| t.id.as_str())
    }

    /// The user id of a caller signed in with the identity provider.
    pub fn user_id(&self) -> Option<&str> {
        self.user.as_ref().map(|u| u.user.as_str())
    }

    pub fn may(&self, action: Action) -> bool {
        match (&self.token, &self.user) {
            (Some(token), _) => token.allows(action),
            (None, Some(user)) => user.actions.contains(&action),
            (None, None) => true,
        }
    }

    fn in_scope(&self, qualified: &str) -> bool {
        self.token
            .as_ref()
            .is_none_or(|t| t.scope_allows(qualified))
    }
}

/// How long audit rows are kept unless `[governance] audit_retention_days`
/// says otherwise.
pub const DEFAULT_AUDIT_RETENTION_DAYS: u64 = 90;

/// Governance settings, from the config file.
#[derive(Debug, Clone)]
pub struct GovernanceConfig {
    /// What applies when no policy matches: allow, deny or require_approval.
    pub default_effect: Effect,
    pub quarantine: QuarantineRules,
    /// How long a call that needs approval waits for it before answering
    /// `approval_required`.
    pub approval_wait: Duration,
    /// How often a waiting call re-reads its approval.
    pub approval_poll: Duration,
    /// How long an approval request stays open.
    pub approval_ttl: Duration,
    /// POSTed a JSON description of each new approval request.
    pub approval_webhook: Option<String>,
    /// Keep (redacted) arguments in the activity audit.
    pub audit_arguments: bool,
    /// Ask a caller whose client declares elicitation (and can be asked, as
    /// a legacy session can) to approve the call itself, beside the operator.
    pub approval_elicitation: bool,
    /// Argument keys whose values are replaced by `"[redacted]"` wherever
    /// arguments are kept (approvals, audit). Case-insensitive substrings.
    pub redact_keys: Vec<String>,
    /// Servers whose results are untrusted input (web pages, inboxes,
    /// tickets anyone can write).
    pub untrusted_servers: BTreeSet<String>,
    /// After a code-mode run has read from an untrusted server, a write or
    /// destructive call to a different server needs approval.
    pub taint_rule: bool,
    /// Audit rows older than this are deleted by the sweeps; `None` keeps
    /// them forever.
    pub audit_retention: Option<Duration>,
    /// Secret masking and the size limit on results.
    pub guardrails: crate::guardrails::Guardrails,
    /// Whether a reply waits for its audit row's commit.
    pub audit_commit: AuditCommit,
}

/// Which untrusted servers one code-mode run has read from. The broker
/// fills it as results come back and consults it before every later call
/// of the run (the cross-server taint rule).
#[derive(Debug, Default)]
pub struct Provenance {
    untrusted_reads: std::sync::Mutex<BTreeSet<String>>,
}

impl Provenance {
    pub fn untrusted_reads(&self) -> Vec<String> {
        self.lock().iter().cloned().collect()
    }

    fn untrusted_reads_other_than(&self, server: &str) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|s| *s != server)
            .cloned()
            .collect()
    }

    pub(crate) fn record_read(&self, server: &str) {
        self.lock().insert(server.to_string());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.untrusted_reads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Default for GovernanceConfig {
    fn default() -> Self {
        GovernanceConfig {
            default_effect: Effect::Allow,
            quarantine: QuarantineRules {
                new_tools: false,
                changed_tools: true,
            },
            approval_wait: Duration::from_secs(30),
            approval_poll: Duration::from_millis(200),
            approval_ttl: Duration::from_secs(3600),
            approval_webhook: None,
            audit_arguments: false,
            approval_elicitation: true,
            redact_keys: [
                "password",
                "secret",
                "token",
                "authorization",
                "api_key",
                "apikey",
            ]
            .map(String::from)
            .to_vec(),
            untrusted_servers: BTreeSet::new(),
            taint_rule: true,
            audit_retention: Some(Duration::from_secs(DEFAULT_AUDIT_RETENTION_DAYS * 86_400)),
            guardrails: Default::default(),
            audit_commit: AuditCommit::Sync,
        }
    }
}

/// Why a call was not forwarded. Each maps to a structured tool error.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("the gateway token is no longer valid ({0})")]
    Unauthenticated(&'static str),
    #[error("this token may not {0}")]
    ActionNotAllowed(Action),
    #[error("denied by {}", policy.as_deref().unwrap_or("the default policy"))]
    Denied { policy: Option<String> },
    #[error("tool is quarantined ({}) until an operator approves it", reason.as_str())]
    Quarantined { reason: QuarantineReason },
    #[error("rate limit reached; retry after {retry_after_ms} ms")]
    RateLimited { policy: String, retry_after_ms: u64 },
    #[error("approval {approval_id} is pending{}; retry the same call once an operator approves it", reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default())]
    ApprovalRequired {
        approval_id: String,
        expires_at: i64,
        /// Why this call needs one when policy alone would not ask.
        reason: Option<String>,
    },
    #[error("approval {approval_id} was denied")]
    ApprovalDenied { approval_id: String },
    #[error("approval refused: {0}")]
    Approval(ApprovalError),
    #[error("governance store unavailable: {0}")]
    Store(#[from] StoreError),
}

impl Refusal {
    /// A short machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Unauthenticated(_) => "unauthenticated",
            Refusal::ActionNotAllowed(_) => "action_not_allowed",
            Refusal::Denied { .. } => "denied",
            Refusal::Quarantined { .. } => "quarantined",
            Refusal::RateLimited { .. } => "rate_limited",
            Refusal::ApprovalRequired { .. } => "approval_required",
            Refusal::ApprovalDenied { .. } => "approval_denied",
            Refusal::Approval(_) => "approval_refused",
            Refusal::Store(_) => "governance_unavailable",
        }
    }

    /// The structured body of the tool error the caller gets.
    pub fn to_json(&self) -> Value {
        let mut out = json!({ "error": self.code(), "message": self.to_string() });
        match self {
            Refusal::RateLimited {
                policy,
                retry_after_ms,
            } => {
                out["retry_after_ms"] = json!(retry_after_ms);
                out["policy"] = json!(policy);
            }
            Refusal::ApprovalRequired {
                approval_id,
                expires_at,
                reason,
            } => {
                out["approval_id"] = json!(approval_id);
                out["expires_at"] = json!(expires_at);
                if let Some(reason) = reason {
                    out["reason"] = json!(reason);
                }
                out["retry"] = json!(
                    "Ask an operator to approve it (manifold approvals approve ID), then repeat \
                     the same call with the same arguments."
                );
            }
            Refusal::ApprovalDenied { approval_id } => out["approval_id"] = json!(approval_id),
            Refusal::Denied { policy } => out["policy"] = json!(policy),
            Refusal::Quarantined { reason } => out["reason"] = json!(reason.as_str()),
            _ => {}
        }
        out
    }

    pub(crate) fn decision(&self) -> Decision {
        match self {
            Refusal::RateLimited { .. } => Decision::RateLimited,
            Refusal::ApprovalRequired { .. } => Decision::ApprovalRequired,
            _ => Decision::Denied,
        }
    }
}

/// A call that may go ahead.
#[derive(Debug, Clone)]
pub struct Authorized {
    pub decision: Decision,
    pub approval_id: Option<String>,
    pub args_hash: String,
}

/// What a caller may see of a view.
pub struct Visible {
    /// Only the tools the caller may call (approval-gated ones included).
    pub view: Arc<CatalogView>,
    /// Qualified names of visible tools that need an approval per call.
    pub needs_approval: HashSet<String>,
}

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

    /// Checks a gateway bearer token and records the attempt in the access
    /// audit.
    ///
    /// A success's access row is queued, not awaited: it is committed with
    /// (or before) the request's own activity or discovery row. A refusal's
    /// row is the request's only one, so it is recorded as `audit_commit`
    /// says.
    pub async fn authenticate(&self, bearer: &str) -> Result<Caller, AuthError> {
        Ok(self.authenticate_request(bearer).await?.0)
    }

    /// [`Governance::authenticate`] for a request the caller keeps serving:
    /// a success's access row lingers from when the returned
    /// [`RequestRows`] drops (as the request ends), so a request whose own
    /// row commits it meanwhile arms no timer for it.
    pub async fn authenticate_request(
        &self,
        bearer: &str,
    ) -> Result<(Caller, RequestRows), AuthError> {
        let now = now_ms();
        let snapshot = self.snapshot();
        let outcome = match snapshot.bearer(bearer) {
            Some(known) => known.at(now),
            None => {
                let outcome = self.store.authenticate(bearer, now).await;
                snapshot.remember_bearer(bearer, &outcome);
                outcome
            }
        };
        match outcome {
            Ok(token) => {
                let caller = Caller::with_token(token);
                let event = AccessEvent::success(now, caller.name.clone(), caller.token_id());
                let rows = self.audit.record_for_request(AuditRow::Access(event)).await;
                Ok((caller, rows))
            }
            Err(error) => {
                let event = AccessEvent::failure(now, token_id_of(bearer), error.reason());
                self.audit.record(AuditRow::Access(event)).await;
                Err(error)
            }
        }
    }

    /// Admits a caller whose identity-provider access token the surface has
    /// verified, and records it in the access audit like a gateway token.
    /// The access row lingers as [`Governance::authenticate_request`] says.
    pub async fn admit_user(&self, grant: UserGrant) -> (Caller, RequestRows) {
        let caller = Caller::with_user(grant);
        let event = AccessEvent::success(now_ms(), caller.name.clone(), None);
        let rows = self.audit.record_for_request(AuditRow::Access(event)).await;
        (caller, rows)
    }

    /// Records an access token from the identity provider that was refused
    /// (`reason` says why; the token itself is never kept).
    pub async fn refuse_user_token(&self, reason: &str) {
        let event = AccessEvent::failure(now_ms(), None, format!("oauth: {reason}"));
        self.audit.record(AuditRow::Access(event)).await;
    }

    /// The part of `view` the caller may use, with policy inputs loaded once.
    /// Records newly seen and changed tool definitions (quarantining them as
    /// configured) and a discovery audit row.
    pub async fn visible(
        &self,
        caller: &Caller,
        view: &CatalogView,
        audit: Option<&str>,
    ) -> Result<Visible, Refusal> {
        if !caller.may(Action::Discover) {
            return Err(Refusal::ActionNotAllowed(Action::Discover));
        }
        let inputs = self.observed_inputs(view).await?;
        let visible = self.filter(caller, view, &inputs);
        if let Some(kind) = audit {
            let names: Vec<&str> = visible.view.tools().map(|t| t.qualified.as_str()).collect();
            self.record_discovery(caller, &names, kind).await;
        }
        Ok(visible)
    }

    /// Records new and changed definitions in `view` (as discovery does) and
    /// returns the policy inputs with them, for the admin catalog.
    pub async fn observe_view(&self, view: &CatalogView) -> Result<PolicyInputs, StoreError> {
        Ok(Arc::unwrap_or_clone(self.observed_inputs(view).await?))
    }

    /// The snapshot's policy inputs, with `view`'s new and changed
    /// definitions recorded first (copying the inputs only then).
    async fn observed_inputs(&self, view: &CatalogView) -> Result<Arc<PolicyInputs>, StoreError> {
        let mut inputs = self.snapshot().inputs(&self.store).await?;
        if self.has_unobserved(view, &inputs) {
            self.observe_changes(view, Arc::make_mut(&mut inputs))
                .await?;
        }
        Ok(inputs)
    }

    fn has_unobserved(&self, view: &CatalogView, inputs: &PolicyInputs) -> bool {
        let classes = classifications_by_tool(inputs);
        view.tools().any(|tool| {
            classes
                .get(&(tool.server.as_str(), tool.upstream_name.as_str()))
                .is_none_or(|c| c.definition_hash != tool.hash)
        })
    }

    fn filter(&self, caller: &Caller, view: &CatalogView, inputs: &PolicyInputs) -> Visible {
        let classes = classifications_by_tool(inputs);
        let groups = match (&caller.user, caller.token_id()) {
            (Some(user), _) => BTreeSet::clone(&user.groups),
            (None, Some(id)) => inputs.groups_of(id),
            (None, None) => BTreeSet::new(),
        };
        let subject = policy::Subject {
            token_id: caller.token_id(),
            user: caller.user_id(),
            groups: &groups,
        };
        // Rules for other principals are dropped once, not once per tool.
        let rules = crate::policy::rules_for(&inputs.policies, subject);
        let mut needs_approval = HashSet::new();
        let mut salt = std::collections::hash_map::DefaultHasher::new();
        let mut view = view.filtered(|tool| {
            let class = classes
                .get(&(tool.server.as_str(), tool.upstream_name.as_str()))
                .copied();
            if !caller.in_scope(&tool.qualified) || self.quarantine_reason(tool, class).is_some() {
                return false;
            }
            let verdict = evaluate(
                rules.iter().copied(),
                subject,
                &tool.server,
                &tool.upstream_name,
                self.tier_of(tool, class),
                self.config.default_effect,
            );
            match verdict.effect {
                Effect::Deny => false,
                Effect::RequireApproval => {
                    needs_approval.insert(tool.qualified.clone());
                    true
                }
                _ => true,
            }
        });
        let mut marked: Vec<&String> = needs_approval.iter().collect();
        marked.sort();
        // The key must also say which tools need approval: two callers who
        // see the same tools, marked differently, get different renderings.
        (view.key, marked).hash(&mut salt);
        view.key = salt.finish();
        Visible {
            view: Arc::new(view),
            needs_approval,
        }
    }

    /// Writes a classification row for each tool that is new to the store or
    /// whose definition changed. Steady state: no statement at all.
    async fn observe_changes(
        &self,
        view: &CatalogView,
        inputs: &mut PolicyInputs,
    ) -> Result<(), StoreError> {
        let stale: Vec<&Arc<CatalogTool>> = {
            let classes = classifications_by_tool(inputs);
            view.tools()
                .filter(|tool| {
                    classes
                        .get(&(tool.server.as_str(), tool.upstream_name.as_str()))
                        .is_none_or(|c| c.definition_hash != tool.hash)
                })
                .collect()
        };
        // One timestamp for the whole batch: the export orders tools by when
        // they were first seen, then by name, so tools first seen together
        // keep one order however long the batch took.
        let now = now_ms();
        for tool in stale {
            let observed = self.observe(tool, now).await?;
            let class = observed.classification().clone();
            match inputs
                .classifications
                .iter_mut()
                .find(|c| c.server == class.server && c.tool == class.tool)
            {
                Some(slot) => *slot = class,
                None => inputs.classifications.push(class),
            }
        }
        Ok(())
    }

    /// The classification of `tool` as defined now: from the snapshot, or
    /// observed (recorded if new or changed) and remembered there.
    async fn classification(
        &self,
        snapshot: &Snapshot,
        tool: &CatalogTool,
    ) -> Result<ToolClassification, StoreError> {
        if let Some(class) = snapshot.classification(&tool.server, &tool.upstream_name, &tool.hash)
        {
            return Ok(class);
        }
        let class = self.observe(tool, now_ms()).await?.classification().clone();
        snapshot.remember_classification(&class);
        Ok(class)
    }

    async fn observe(
        &self,
        tool: &CatalogTool,
        now: i64,
    ) -> Result<manifold_store::ToolObservation, StoreError> {
        // A tool seen for the first time is held back when its server is
        // untrusted, or (with quarantine_new_tools) when it is not read-only
        // by its hints, or when its server was already known: a tool that
        // vanishes and returns under a new name claiming `readOnlyHint`
        // is a new tool on a known server, not a first import.
        let held = self.is_untrusted(&tool.server)
            || (self.config.quarantine.new_tools && hinted_tier(tool) != RiskTier::ReadOnly);
        let on_new_server = if held {
            ToolStatus::Quarantined
        } else {
            ToolStatus::Approved
        };
        let status_if_new = manifold_store::NewToolStatus {
            on_new_server,
            on_known_server: if self.config.quarantine.new_tools {
                ToolStatus::Quarantined
            } else {
                on_new_server
            },
        };
        let observed = self
            .store
            .observe_tool(
                &tool.server,
                &tool.upstream_name,
                &tool.hash,
                status_if_new,
                now,
            )
            .await?;
        if let manifold_store::ToolObservation::Changed {
            previous_hash,
            current,
        } = &observed
            && !current.is_callable()
        {
            tracing::warn!(server = %tool.server, tool = %tool.upstream_name, %previous_hash, new_hash = %tool.hash, "tool definition changed since approval; quarantined");
        }
        Ok(observed)
    }

    /// The caller's token as the store has it now, if it has one: refused
    /// when it was revoked, has expired since the request was admitted, or
    /// lacks `action`.
    pub(crate) async fn current_token(
        &self,
        snapshot: &Snapshot,
        caller: &Caller,
        action: Action,
    ) -> Result<Option<TokenRecord>, Refusal> {
        let Some(token) = &caller.token else {
            // A user's grant was verified at admission; auth off allows all.
            return if caller.may(action) {
                Ok(None)
            } else {
                Err(Refusal::ActionNotAllowed(action))
            };
        };
        let current = snapshot
            .token(&self.store, &token.id)
            .await?
            .ok_or(Refusal::Unauthenticated("unknown"))?;
        if current.is_revoked() {
            return Err(Refusal::Unauthenticated("revoked"));
        }
        if current.is_expired(caller.admitted_at) {
            return Err(Refusal::Unauthenticated("expired"));
        }
        if !current.allows(action) {
            return Err(Refusal::ActionNotAllowed(action));
        }
        Ok(Some(current))
    }

    /// The caller's groups: a token's from the store (through the
    /// snapshot), a user's from its access token's groups claim.
    async fn groups_of(
        &self,
        snapshot: &Snapshot,
        caller: &Caller,
    ) -> Result<Arc<BTreeSet<String>>, StoreError> {
        match (&caller.user, caller.token_id()) {
            (Some(user), _) => Ok(Arc::clone(&user.groups)),
            (None, Some(id)) => snapshot.groups(&self.store, id).await,
            (None, None) => Ok(Arc::default()),
        }
    }

    /// The rules that apply to `caller` now, read once for one request:
    /// its current token (which must allow `action`), the policies and its
    /// groups.
    pub async fn rules(&self, caller: &Caller, action: Action) -> Result<Rules, Refusal> {
        let snapshot = self.snapshot();
        let token = self.current_token(&snapshot, caller, action).await?;
        let policies = snapshot.policies(&self.store).await?;
        let groups = self.groups_of(&snapshot, caller).await?;
        Ok(Rules {
            scopes: token.map(|t| t.scopes),
            token_id: caller.token_id().map(str::to_string),
            user: caller.user_id().map(str::to_string),
            groups,
            policies,
            default: self.config.default_effect,
            verdicts: Arc::clone(snapshot.verdicts()),
        })
    }

    /// Decides a request that is not a tool call against `rules`: scope,
    /// policy and, for a request that uses an upstream, rate limits and
    /// approval. A refusal is recorded in the activity audit with its kind.
    pub(crate) async fn decide(
        &self,
        rules: &Rules,
        caller: &Caller,
        kind: RequestKind,
        subject: &Subject,
        arguments: &JsonObject,
    ) -> Result<(), Refusal> {
        let decided = self
            .decide_unrecorded(rules, caller, kind, subject, arguments)
            .await;
        if let Err(refusal) = &decided {
            self.record_refusal(
                caller,
                kind.as_str(),
                &subject.qualified,
                arguments,
                refusal,
            )
            .await;
        }
        decided
    }

    async fn decide_unrecorded(
        &self,
        rules: &Rules,
        caller: &Caller,
        kind: RequestKind,
        subject: &Subject,
        arguments: &JsonObject,
    ) -> Result<(), Refusal> {
        let verdict = rules.check(subject)?;
        if !kind.uses_upstream() {
            return Ok(());
        }
        self.check_rate_limits(&verdict, caller, &subject.server, &subject.qualified)
            .await?;
        if verdict.effect == Effect::RequireApproval {
            let args_hash = hash_argument_object(arguments);
            // An operator's rule: the caller's own client is never asked.
            self.await_approval(
                caller,
                &subject.qualified,
                arguments,
                &args_hash,
                None,
                None,
            )
            .await?;
        }
        Ok(())
    }

    /// Decides whether `caller` may call `tool` with `arguments` now,
    /// re-reading the token, the policies and the rate counters. A call
    /// that needs approval waits for it (up to the configured time).
    pub async fn authorize(
        &self,
        caller: &Caller,
        tool: &CatalogTool,
        arguments: &JsonObject,
        approval_id: Option<&str>,
    ) -> Result<Authorized, Refusal> {
        self.authorize_with(
            caller,
            tool,
            arguments,
            approval_id,
            None,
            &CallContext::default(),
        )
        .await
    }

    /// [`Governance::authorize`] for a call made inside a code-mode run
    /// that has read what `provenance` records.
    pub async fn authorize_with(
        &self,
        caller: &Caller,
        tool: &CatalogTool,
        arguments: &JsonObject,
        approval_id: Option<&str>,
        provenance: Option<&Provenance>,
        context: &CallContext,
    ) -> Result<Authorized, Refusal> {
        let args_hash = hash_argument_object(arguments);
        let snapshot = self.snapshot();
        if let Some(current) = self.current_token(&snapshot, caller, Action::Call).await?
            && !current.scope_allows(&tool.qualified)
        {
            return Err(Refusal::Denied { policy: None });
        }
        // Only this tool's classification and this caller's groups: a call's
        // reads do not grow with the catalog, and come from the snapshot.
        let class = self.classification(&snapshot, tool).await?;
        if let Some(reason) = self.quarantine_reason(tool, Some(&class)) {
            return Err(Refusal::Quarantined { reason });
        }
        let policies = snapshot.policies(&self.store).await?;
        let groups = self.groups_of(&snapshot, caller).await?;
        let subject = policy::Subject {
            token_id: caller.token_id(),
            user: caller.user_id(),
            groups: &groups,
        };
        let tier = self.tier_of(tool, Some(&class));
        let asked = (
            subject,
            tool.server.as_str(),
            tool.upstream_name.as_str(),
            Some(tier),
        );
        let verdict = snapshot.verdicts().get_or(asked, || {
            evaluate(
                policies.iter(),
                subject,
                &tool.server,
                &tool.upstream_name,
                tier,
                self.config.default_effect,
            )
        });
        if verdict.effect == Effect::Deny {
            return Err(Refusal::Denied {
                policy: verdict.policy_id,
            });
        }
        self.check_rate_limits(&verdict, caller, &tool.server, &tool.qualified)
            .await?;
        let tainted_by = provenance
            .filter(|_| self.config.taint_rule && tier != RiskTier::ReadOnly)
            .map(|p| p.untrusted_reads_other_than(&tool.server))
            .filter(|servers| !servers.is_empty());
        if verdict.effect != Effect::RequireApproval && tainted_by.is_none() {
            return Ok(Authorized {
                decision: Decision::Allowed,
                approval_id: None,
                args_hash,
            });
        }
        // Only the taint rule's question (a user confirming their own
        // script's cross-server write) may go to the caller's client; an
        // operator's require_approval is never answered by the caller.
        let ask_caller = (verdict.effect != Effect::RequireApproval).then_some(context);
        let approval_id = self
            .await_approval(
                caller,
                &tool.qualified,
                arguments,
                &args_hash,
                approval_id,
                ask_caller,
            )
            .await
            .map_err(|refusal| match (refusal, tainted_by) {
                (
                    Refusal::ApprovalRequired {
                        approval_id,
                        expires_at,
                        ..
                    },
                    Some(servers),
                ) if verdict.effect != Effect::RequireApproval => Refusal::ApprovalRequired {
                    approval_id,
                    expires_at,
                    reason: Some(format!(
                        "this run has read from untrusted server{} {}, and '{}' is a {} tool on \
                         another server",
                        if servers.len() == 1 { "" } else { "s" },
                        servers.join(", "),
                        tool.qualified,
                        tier.as_str(),
                    )),
                },
                (refusal, _) => refusal,
            })?;
        Ok(Authorized {
            decision: Decision::Approved,
            approval_id: Some(approval_id),
            args_hash,
        })
    }

    /// Counts this request in every rate window its verdict names (one per
    /// server when the rule names the server only, else one per name).
    async fn check_rate_limits(
        &self,
        verdict: &crate::policy::Verdict,
        caller: &Caller,
        server: &str,
        qualified: &str,
    ) -> Result<(), Refusal> {
        let now = now_ms();
        for rule in &verdict.rate_limits {
            let target = if rule.per_server { server } else { qualified };
            let key = format!("{}|{}|{}", rule.policy_id, caller.name, target);
            let hit = self
                .store
                .rate_limit_hit(&key, rule.window_seconds, rule.limit, now)
                .await?;
            if !hit.allowed {
                return Err(Refusal::RateLimited {
                    policy: rule.policy_id.clone(),
                    retry_after_ms: hit.retry_after_ms,
                });
            }
        }
        Ok(())
    }

    /// Finds or files the approval for this exact call, waits for an
    /// operator's decision and consumes it. Returns the approval id.
    async fn await_approval(
        &self,
        caller: &Caller,
        tool: &str,
        arguments: &JsonObject,
        args_hash: &str,
        presented: Option<&str>,
        ask_caller: Option<&CallContext>,
    ) -> Result<String, Refusal> {
        let id = match presented {
            Some(id) => id.to_string(),
            None => match self
                .store
                .find_open_approval(&caller.name, tool, args_hash, now_ms())
                .await?
            {
                Some(open) => open.id,
                None => {
                    self.file_approval(caller, tool, arguments, args_hash)
                        .await?
                }
            },
        };
        let deadline = tokio::time::Instant::now() + self.config.approval_wait;
        // The caller's own user may answer while the operator has not; the
        // question is withdrawn when the wait ends.
        let _asking =
            ask_caller.and_then(|context| self.ask_caller(context, caller, tool, arguments, &id));
        loop {
            // Registered before the read, so a decision between the read and
            // the wait is not missed.
            let decided = self.approvals_decided.notified();
            tokio::pin!(decided);
            decided.as_mut().enable();
            let approval = self
                .store
                .get_approval(&id)
                .await?
                .ok_or(Refusal::Approval(ApprovalError::NotFound))?;
            match approval.status {
                ApprovalStatus::Approved => {
                    self.store
                        .consume_approval(&id, &caller.name, tool, args_hash, now_ms())
                        .await
                        .map_err(Refusal::Approval)?;
                    return Ok(id);
                }
                ApprovalStatus::Denied => return Err(Refusal::ApprovalDenied { approval_id: id }),
                ApprovalStatus::Pending if approval.expires_at <= now_ms() => {
                    return Err(Refusal::Approval(ApprovalError::Expired));
                }
                ApprovalStatus::Pending => {}
            }
            if approval.principal != caller.name
                || approval.tool != tool
                || approval.args_hash != args_hash
            {
                return Err(Refusal::Approval(ApprovalError::Mismatch));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Refusal::ApprovalRequired {
                    approval_id: id,
                    expires_at: approval.expires_at,
                    reason: None,
                });
            }
            // The poll is the fallback when no event arrives (SQLite, or a
            // lost listener connection).
            let wait = self
                .config
                .approval_poll
                .min(deadline.saturating_duration_since(tokio::time::Instant::now()));
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = &mut decided => {}
            }
        }
    }

    /// Sends an approval question to the caller's client through the call's
    /// relay, if elicitation is on and the client declared it. Only an
    /// explicit `approve: true` approves and an explicit decline denies; any
    /// other answer leaves it to the operator. Used for the taint rule only.
    fn ask_caller(
        &self,
        context: &CallContext,
        caller: &Caller,
        tool: &str,
        arguments: &JsonObject,
        approval_id: &str,
    ) -> Option<AbortOnDrop> {
        if !self.config.approval_elicitation {
            return None;
        }
        let relay = context.relay.clone()?;
        context.client_capabilities.as_ref()?.elicitation.as_ref()?;
        let message = format!(
            "Manifold: approve a call to {} with arguments {}? (approval {approval_id})",
            tool,
            self.redact(&Value::Object(arguments.clone()))
        );
        let request: rmcp::model::ServerRequest = serde_json::from_value(json!({
            "method": "elicitation/create",
            "params": {
                "mode": "form",
                "message": message,
                "requestedSchema": {
                    "type": "object",
                    "properties": {"approve": {"type": "boolean", "title": "Approve this call"}},
                    "required": ["approve"],
                },
            },
        }))
        .ok()?;
        let store = self.store.clone();
        let (id, by) = (
            approval_id.to_string(),
            format!("elicitation:{}", caller.name),
        );
        let task = tokio::spawn(async move {
            let (reply, answer) = tokio::sync::oneshot::channel();
            if relay
                .send(manifold_upstream::Relay::Request { request, reply })
                .is_err()
            {
                return;
            }
            let Ok(Ok(rmcp::model::ClientResult::ElicitResult(result))) = answer.await else {
                return;
            };
            let approve = match result.action {
                rmcp::model::ElicitationAction::Accept => {
                    match result.content.as_ref().and_then(|c| c["approve"].as_bool()) {
                        Some(answer) => answer,
                        None => return,
                    }
                }
                rmcp::model::ElicitationAction::Decline => false,
                _ => return,
            };
            if let Err(error) = store.decide_approval(&id, approve, &by).await {
                tracing::debug!(%error, approval = %id, "elicited decision not recorded");
            }
        });
        Some(AbortOnDrop(task))
    }

    async fn file_approval(
        &self,
        caller: &Caller,
        tool: &str,
        arguments: &JsonObject,
        args_hash: &str,
    ) -> Result<String, StoreError> {
        let redacted = self.redact(&Value::Object(arguments.clone()));
        let ttl_ms = i64::try_from(self.config.approval_ttl.as_millis()).unwrap_or(i64::MAX);
        let expires_at = now_ms().saturating_add(ttl_ms);
        let id = self
            .store
            .create_approval(&caller.name, tool, args_hash, &redacted, expires_at)
            .await?;
        tracing::info!(approval = %id, tool = %tool, caller = %caller.name, "approval requested");
        if let Some(url) = self.config.approval_webhook.clone() {
            let body = json!({
                "event": "approval_requested",
                "approval_id": id,
                "principal": caller.name,
                "tool": tool,
                "arguments": redacted,
                "args_hash": args_hash,
                "expires_at": expires_at,
            });
            let http = self.http.clone();
            // The call waits on the store, not on the webhook's receiver.
            tokio::spawn(async move {
                if let Err(error) = http.post(&url).json(&body).send().await {
                    tracing::warn!(%error, "approval webhook failed");
                }
            });
        }
        Ok(id)
    }

    /// One pass of every cleanup: expired tokens (in bounded batches),
    /// approvals, rate-limit windows, and audit rows past their retention.
    pub async fn sweep(&self) -> Result<SweepReport, StoreError> {
        let now = now_ms();
        let tokens = self.store.sweep_all_expired(now).await?;
        let approvals = self.store.sweep_expired_approvals(now - 86_400_000).await?;
        let windows = self.store.sweep_rate_limits(now).await?;
        let mut audit_rows = 0;
        if let Some(retention) = self.config.audit_retention {
            let before =
                now.saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
            for kind in manifold_store::AuditKind::ALL {
                audit_rows += self.store.sweep_audit(kind, before).await?;
            }
        }
        Ok(SweepReport {
            token_passes: tokens,
            approvals,
            windows,
            audit_rows,
        })
    }
}

/// Aborts a background task when the scope that started it ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepReport {
    /// Tokens deleted per pass.
    pub token_passes: Vec<usize>,
    pub approvals: u64,
    /// Audit rows (all three trails) past `audit_retention`.
    pub audit_rows: u64,
    pub windows: u64,
}
