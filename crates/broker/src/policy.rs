//! Pure policy decisions: from a tool, a caller and the store's policy
//! inputs to what the caller may do with it. No I/O here, so a listing of any
//! size is decided in memory from one load of the inputs.

use std::collections::{BTreeSet, HashMap};

use manifold_catalog::CatalogTool;
use manifold_store::{Effect, Policy, PolicyInputs, RiskTier, ToolClassification};

/// The tier a tool is treated as. An operator's classification wins;
/// otherwise the upstream's annotations, read pessimistically: a tool is
/// read-only only if it says so, non-destructive only if it says so, and a
/// tool that says nothing is destructive.
pub fn effective_tier(tool: &CatalogTool, class: Option<&ToolClassification>) -> RiskTier {
    if let Some(tier) = class.and_then(|c| c.tier) {
        return tier;
    }
    hinted_tier(tool)
}

/// The tier the upstream's annotations claim, defaulting to destructive.
pub fn hinted_tier(tool: &CatalogTool) -> RiskTier {
    match &tool.definition.annotations {
        Some(a) if a.read_only_hint == Some(true) => RiskTier::ReadOnly,
        Some(a) if a.destructive_hint == Some(false) => RiskTier::Write,
        _ => RiskTier::Destructive,
    }
}

/// Why a tool is held back regardless of policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuarantineReason {
    /// New write or destructive tool, or quarantined by an operator; never
    /// approved.
    NotApproved,
    /// Its definition changed since an operator approved it.
    DefinitionChanged,
}

impl QuarantineReason {
    pub fn as_str(self) -> &'static str {
        match self {
            QuarantineReason::NotApproved => "not_approved",
            QuarantineReason::DefinitionChanged => "definition_changed",
        }
    }
}

/// Which quarantine rules apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuarantineRules {
    /// Hold back newly seen write and destructive tools until approved.
    pub new_tools: bool,
    /// Hold back a tool whose definition changed since its approval.
    pub changed_tools: bool,
}

impl QuarantineRules {
    /// Whether `tool` is held back. `class` is the stored row, which may
    /// describe an older definition than the one the catalog holds now. A
    /// tool of an `untrusted` server that was never approved is always held:
    /// its own hints cannot vouch for it.
    pub fn check(
        self,
        tool: &CatalogTool,
        class: Option<&ToolClassification>,
        untrusted: bool,
    ) -> Option<QuarantineReason> {
        match class {
            None => (untrusted || (self.new_tools && hinted_tier(tool) != RiskTier::ReadOnly))
                .then_some(QuarantineReason::NotApproved),
            Some(c) => match c.approved_hash.as_deref() {
                Some(approved) if approved == tool.hash => None,
                Some(_) => self
                    .changed_tools
                    .then_some(QuarantineReason::DefinitionChanged),
                None => Some(QuarantineReason::NotApproved),
            },
        }
    }
}

/// A rate limit that applies to a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateRule {
    pub policy_id: String,
    pub limit: u32,
    pub window_seconds: u32,
    /// The rule names the server only (`tool = "*"`): one window for all of
    /// its tools. Otherwise one window per tool.
    pub per_server: bool,
    /// The rule names no server, tool or tier: one window for everything
    /// the principal calls, counted before a call's name is looked up.
    pub principal_wide: bool,
}

/// What the policies say about one caller and one tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `Allow`, `Deny` or `RequireApproval`.
    pub effect: Effect,
    /// The rule that decided it; `None` when the default did.
    pub policy_id: Option<String>,
    pub rate_limits: Vec<RateRule>,
}

/// The caller facts a policy matches on.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub token_id: Option<&'a str>,
    /// The user id of a caller signed in with the identity provider.
    pub user: Option<&'a str>,
    pub groups: &'a BTreeSet<String>,
}

/// What policies' server and tool globs match: a server and a name, and
/// for a tool the operator renamed, its new name as well, so that a rename
/// escapes no rule written for the upstream's name (deny wins either way).
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub server: &'a str,
    pub name: &'a str,
    pub renamed: Option<&'a str>,
}

impl<'a> Target<'a> {
    pub fn named(server: &'a str, name: &'a str) -> Self {
        Target {
            server,
            name,
            renamed: None,
        }
    }

    /// A tool by its upstream name and, if renamed, its new one.
    pub fn tool(tool: &'a CatalogTool) -> Self {
        Target {
            server: &tool.server,
            name: &tool.upstream_name,
            renamed: tool.renamed(),
        }
    }

    fn matched_by(&self, policy: &Policy, tier: Option<RiskTier>) -> bool {
        policy.matches_tool(self.server, self.name, tier)
            || self
                .renamed
                .is_some_and(|renamed| policy.matches_tool(self.server, renamed, tier))
    }
}

/// Deny wins over approval, approval over allow; with no matching rule the
/// default applies. Rate limits add up: every matching one applies.
pub fn evaluate<'p>(
    policies: impl IntoIterator<Item = &'p Policy>,
    subject: Subject<'_>,
    target: Target<'_>,
    tier: RiskTier,
    default: Effect,
) -> Verdict {
    let mut deny = None;
    let mut approval = None;
    let mut allow = None;
    let mut rate_limits = Vec::new();
    for policy in policies {
        if !policy
            .principal
            .matches(subject.token_id, subject.user, subject.groups)
            || !target.matched_by(policy, Some(tier))
        {
            continue;
        }
        match policy.effect {
            Effect::Deny => {
                deny.get_or_insert(&policy.id);
            }
            Effect::RequireApproval => {
                approval.get_or_insert(&policy.id);
            }
            Effect::Allow => {
                allow.get_or_insert(&policy.id);
            }
            Effect::RateLimit {
                limit,
                window_seconds,
            } => rate_limits.push(RateRule {
                policy_id: policy.id.clone(),
                limit,
                window_seconds,
                per_server: policy.tool_glob == "*",
                principal_wide: policy.is_principal_wide(),
            }),
        }
    }
    let (effect, policy_id) = if let Some(id) = deny {
        (Effect::Deny, Some(id.clone()))
    } else if let Some(id) = approval {
        (Effect::RequireApproval, Some(id.clone()))
    } else if let Some(id) = allow {
        (Effect::Allow, Some(id.clone()))
    } else {
        (default, None)
    };
    Verdict {
        effect,
        policy_id,
        rate_limits,
    }
}

/// The rules that name this subject: what a listing evaluates per tool.
pub fn rules_for<'p>(policies: &'p [Policy], subject: Subject<'_>) -> Vec<&'p Policy> {
    policies
        .iter()
        .filter(|p| {
            p.principal
                .matches(subject.token_id, subject.user, subject.groups)
        })
        .collect()
}

/// Classifications by `(server, upstream tool name)`.
pub fn classifications_by_tool(
    inputs: &PolicyInputs,
) -> HashMap<(&str, &str), &ToolClassification> {
    inputs
        .classifications
        .iter()
        .map(|c| ((c.server.as_str(), c.tool.as_str()), c))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use manifold_store::{PrincipalSelector, TierSelector};

    fn rule(id: &str, effect: Effect, principal: PrincipalSelector, tier: TierSelector) -> Policy {
        Policy {
            id: id.into(),
            principal,
            server_glob: "*".into(),
            tool_glob: "*".into(),
            tier,
            effect,
            description: String::new(),
            created_at: 0,
        }
    }

    #[test]
    fn deny_wins_then_approval_then_allow_then_default() {
        let none = BTreeSet::new();
        let ops: BTreeSet<String> = ["ops".to_string()].into();
        let subject = Subject {
            token_id: Some("t1"),
            user: None,
            groups: &ops,
        };
        let everyone = PrincipalSelector::Everyone;
        let allow = rule("a", Effect::Allow, everyone.clone(), TierSelector::Any);
        let approve = rule(
            "r",
            Effect::RequireApproval,
            PrincipalSelector::Group("ops".into()),
            TierSelector::Only(RiskTier::Destructive),
        );
        let deny = rule(
            "d",
            Effect::Deny,
            PrincipalSelector::Token("t1".into()),
            TierSelector::Only(RiskTier::Write),
        );
        let policies = vec![allow.clone(), approve, deny];
        let decide = |tier, subject| {
            evaluate(
                &policies,
                subject,
                Target::named("s", "t"),
                tier,
                Effect::Deny,
            )
            .effect
        };
        assert_eq!(decide(RiskTier::ReadOnly, subject), Effect::Allow);
        assert_eq!(decide(RiskTier::Write, subject), Effect::Deny);
        assert_eq!(
            decide(RiskTier::Destructive, subject),
            Effect::RequireApproval
        );
        let stranger = Subject {
            token_id: Some("t2"),
            user: None,
            groups: &none,
        };
        assert_eq!(decide(RiskTier::Write, stranger), Effect::Allow);
        assert_eq!(decide(RiskTier::Destructive, stranger), Effect::Allow);
        // A signed-in user whose id equals a token id is not that token.
        let user = Subject {
            token_id: None,
            user: Some("t1"),
            groups: &none,
        };
        assert_eq!(decide(RiskTier::Write, user), Effect::Allow);
        let verdict = evaluate(
            &[],
            stranger,
            Target::named("s", "t"),
            RiskTier::ReadOnly,
            Effect::Deny,
        );
        assert_eq!((verdict.effect, verdict.policy_id), (Effect::Deny, None));
    }

    #[test]
    fn rate_limits_accumulate() {
        let none = BTreeSet::new();
        let subject = Subject {
            token_id: None,
            user: None,
            groups: &none,
        };
        let mut per_tool = rule(
            "p1",
            Effect::RateLimit {
                limit: 5,
                window_seconds: 60,
            },
            PrincipalSelector::Everyone,
            TierSelector::Any,
        );
        per_tool.tool_glob = "get_*".into();
        let per_server = rule(
            "p2",
            Effect::RateLimit {
                limit: 50,
                window_seconds: 3600,
            },
            PrincipalSelector::Everyone,
            TierSelector::Any,
        );
        let verdict = evaluate(
            &[per_tool, per_server],
            subject,
            Target::named("s", "get_x"),
            RiskTier::ReadOnly,
            Effect::Allow,
        );
        assert_eq!(verdict.effect, Effect::Allow);
        assert_eq!(verdict.rate_limits.len(), 2);
        assert!(!verdict.rate_limits[0].per_server);
        assert!(verdict.rate_limits[1].per_server);
    }

    /// A renamed tool answers to rules on either name; deny still wins.
    #[test]
    fn a_rule_on_either_name_of_a_renamed_tool_applies() {
        let none = BTreeSet::new();
        let subject = Subject {
            token_id: None,
            user: None,
            groups: &none,
        };
        let named = |tool: &str, effect| {
            let mut policy = rule(tool, effect, PrincipalSelector::Everyone, TierSelector::Any);
            policy.server_glob = "files".into();
            policy.tool_glob = tool.into();
            policy
        };
        let renamed = Target {
            server: "files",
            name: "purge",
            renamed: Some("tidy"),
        };
        for deny in ["purge", "tidy", "pur*", "ti*"] {
            let policies = [named(deny, Effect::Deny), named("tidy", Effect::Allow)];
            let verdict = evaluate(&policies, subject, renamed, RiskTier::Write, Effect::Allow);
            assert_eq!(verdict.effect, Effect::Deny, "a deny on {deny}");
        }
        let policies = [named("tidy", Effect::Deny)];
        let plain = Target::named("files", "purge");
        let verdict = evaluate(&policies, subject, plain, RiskTier::Write, Effect::Allow);
        assert_eq!(
            verdict.effect,
            Effect::Allow,
            "only a renamed tool has two names"
        );
    }
}
