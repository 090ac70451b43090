//! What a caller may see of a view, and the recording of new and changed
//! tool definitions that discovery (and a call of a changed tool) does first.

use std::{
    collections::{BTreeSet, HashSet},
    hash::{Hash, Hasher},
    sync::Arc,
};

use manifold_catalog::{CatalogTool, CatalogView};
use manifold_store::{Action, Effect, PolicyInputs, RiskTier, StoreError, ToolStatus, now_ms};

use super::{Governance, caller::Caller, refusal::Refusal};
use crate::policy::{self, Target, classifications_by_tool, evaluate, hinted_tier};

/// What a caller may see of a view.
pub struct Visible {
    /// Only the tools the caller may call (approval-gated ones included).
    pub view: Arc<CatalogView>,
    /// Qualified names of visible tools that need an approval per call.
    pub needs_approval: HashSet<String>,
}

impl Governance {
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
        let rules = policy::rules_for(&inputs.policies, subject);
        let mut needs_approval = HashSet::new();
        let mut salt = std::collections::hash_map::DefaultHasher::new();
        let mut view = view.filtered(|tool| {
            let class = classes
                .get(&(tool.server.as_str(), tool.upstream_name.as_str()))
                .copied();
            if !caller.tool_in_scope(tool) || self.quarantine_reason(tool, class).is_some() {
                return false;
            }
            let verdict = evaluate(
                rules.iter().copied(),
                subject,
                Target::tool(tool),
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

    /// Records `tool`'s definition if it is new or changed.
    pub(super) async fn observe(
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
}
