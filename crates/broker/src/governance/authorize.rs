//! Whether a tool call may go ahead now: the token, quarantine, policy, rate
//! limits, the taint rule and approval.

use std::{collections::BTreeSet, sync::Arc};

use manifold_catalog::CatalogTool;
use manifold_store::{
    Action, Decision, Effect, RiskTier, StoreError, TokenRecord, ToolClassification,
    hash_argument_object, now_ms,
};
use manifold_upstream::CallContext;
use rmcp::model::JsonObject;

use super::{
    Governance,
    caller::{Caller, Provenance},
    refusal::Refusal,
};
use crate::{
    policy::{self, Target, Verdict, evaluate},
    snapshot::Snapshot,
};

/// A call that may go ahead.
#[derive(Debug, Clone)]
pub struct Authorized {
    pub decision: Decision,
    pub approval_id: Option<String>,
    pub args_hash: String,
}

impl Governance {
    /// The caller's token as the store has it now, if it has one: refused
    /// when it was revoked, has expired since the request was admitted, or
    /// lacks `action`.
    pub(super) async fn current_token(
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
    pub(super) async fn groups_of(
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

    /// What a tool call must pass before its name is looked up, so that a
    /// caller who may not call stores nothing by naming: the token's `call`
    /// action, and the rate limits of rules that name no server, tool or
    /// tier (one window per principal). From the snapshot: no statement
    /// unless such a rule matches.
    pub async fn admit_call(&self, caller: &Caller) -> Result<(), Refusal> {
        let snapshot = self.snapshot();
        self.current_token(&snapshot, caller, Action::Call).await?;
        let policies = snapshot.policies(&self.store).await?;
        if !policies.iter().any(|p| p.is_principal_wide()) {
            return Ok(());
        }
        let groups = self.groups_of(&snapshot, caller).await?;
        let subject = policy::Subject {
            token_id: caller.token_id(),
            user: caller.user_id(),
            groups: &groups,
        };
        let wide = policies.iter().filter(|p| p.is_principal_wide());
        // Any server and tool will do: the rules match them all.
        let verdict = evaluate(
            wide,
            subject,
            Target::named("*", "*"),
            RiskTier::ReadOnly,
            Effect::Allow,
        );
        self.check_rate_limits(&verdict, caller, "*", "*", Wide::Count)
            .await
    }

    /// Decides whether `caller` may call `tool` with `arguments` now,
    /// re-reading the token, the policies and the rate counters. A call
    /// that needs approval waits for it (up to the configured time).
    /// Includes [`Governance::admit_call`].
    pub async fn authorize(
        &self,
        caller: &Caller,
        tool: &CatalogTool,
        arguments: &JsonObject,
        approval_id: Option<&str>,
    ) -> Result<Authorized, Refusal> {
        self.admit_call(caller).await?;
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

    /// [`Governance::authorize`] after [`Governance::admit_call`], for a
    /// call made inside a code-mode run that has read what `provenance`
    /// records.
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
        let (verdict, tier) = self.verdict(caller, tool).await?;
        self.check_rate_limits(&verdict, caller, &tool.server, &tool.qualified, Wide::Skip)
            .await?;
        let tainted_by = provenance
            .filter(|_| self.config.taint_rule && tier != RiskTier::ReadOnly)
            .map(|p| p.untrusted_reads_other_than(&tool.server))
            .filter(|servers| !servers.is_empty());
        let required = verdict.effect == Effect::RequireApproval;
        if !required && tainted_by.is_none() {
            return Ok(Authorized {
                decision: Decision::Allowed,
                approval_id: None,
                args_hash,
            });
        }
        // Only the taint rule's question (a user confirming their own
        // script's cross-server write) may go to the caller's client; an
        // operator's require_approval is never answered by the caller.
        let ask_caller = (!required).then_some(context);
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
            .map_err(|refusal| match tainted_by {
                Some(servers) if !required => tainted(refusal, &servers, tool, tier),
                _ => refusal,
            })?;
        Ok(Authorized {
            decision: Decision::Approved,
            approval_id: Some(approval_id),
            args_hash,
        })
    }

    /// Whether a call of `caller` to `tool` would wait for an operator's
    /// approval (policy only; a refusal or an allow is `false`).
    pub(crate) async fn needs_approval(&self, caller: &Caller, tool: &CatalogTool) -> bool {
        matches!(
            self.verdict(caller, tool).await,
            Ok((verdict, _)) if verdict.effect == Effect::RequireApproval
        )
    }

    /// The policy verdict on `caller` calling `tool`, and the tier it was
    /// judged at; refused when the token's scope, quarantine or a policy
    /// says no. Reads only this tool's classification and this caller's
    /// groups, from the snapshot: a call's reads do not grow with the
    /// catalog.
    async fn verdict(
        &self,
        caller: &Caller,
        tool: &CatalogTool,
    ) -> Result<(Verdict, RiskTier), Refusal> {
        let snapshot = self.snapshot();
        if let Some(current) = self.current_token(&snapshot, caller, Action::Call).await?
            && !super::caller::scope_allows_tool(|name| current.scope_allows(name), tool)
        {
            return Err(Refusal::Denied { policy: None });
        }
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
        let target = Target::tool(tool);
        let verdict = snapshot
            .verdicts()
            .get_or((subject, target, Some(tier)), || {
                evaluate(
                    policies.iter(),
                    subject,
                    target,
                    tier,
                    self.config.default_effect,
                )
            });
        if verdict.effect == Effect::Deny {
            return Err(Refusal::Denied {
                policy: verdict.policy_id,
            });
        }
        Ok((verdict, tier))
    }

    /// Counts this request in every rate window its verdict names (one per
    /// principal for a principal-wide rule, one per server when the rule
    /// names the server only, else one per name).
    pub(super) async fn check_rate_limits(
        &self,
        verdict: &Verdict,
        caller: &Caller,
        server: &str,
        qualified: &str,
        wide: Wide,
    ) -> Result<(), Refusal> {
        let now = now_ms();
        for rule in &verdict.rate_limits {
            if rule.principal_wide && wide == Wide::Skip {
                continue;
            }
            let target = if rule.principal_wide {
                "*"
            } else if rule.per_server {
                server
            } else {
                qualified
            };
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
}

/// Whether a rate check counts the principal-wide rules: a tool call's
/// were counted before its name was looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wide {
    Count,
    Skip,
}

/// An approval the taint rule asked for, still pending: the refusal says
/// why this call needs one when policy alone would not ask.
fn tainted(refusal: Refusal, servers: &[String], tool: &CatalogTool, tier: RiskTier) -> Refusal {
    let Refusal::ApprovalRequired {
        approval_id,
        expires_at,
        ..
    } = refusal
    else {
        return refusal;
    };
    Refusal::ApprovalRequired {
        approval_id,
        expires_at,
        reason: Some(format!(
            "this run has read from untrusted server{} {}, and '{}' is a {} tool on another \
             server",
            if servers.len() == 1 { "" } else { "s" },
            servers.join(", "),
            tool.qualified,
            tier.as_str(),
        )),
    }
}
