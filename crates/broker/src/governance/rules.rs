//! The rules for requests that are not tool calls: what a rule matches a
//! request on, one caller's rules for one request, and the decision.

use std::{collections::BTreeSet, sync::Arc};

use manifold_store::{Action, Effect, Policy, RiskTier, glob_match, hash_argument_object};
use rmcp::model::JsonObject;

use super::{Governance, caller::Caller, refusal::Refusal};
use crate::{
    policy::{self, Target, Verdict, evaluate},
    snapshot::Verdicts,
};

/// The kinds of request the broker decides, named as the activity audit
/// records them (`details.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestKind {
    ToolsCall,
    ToolsList,
    PromptsList,
    PromptsGet,
    ResourcesList,
    ResourceTemplatesList,
    ResourcesRead,
    ResourcesSubscribe,
    ResourcesUnsubscribe,
    Complete,
    EnableServer,
    DisableServer,
    ExecuteCode,
    TasksGet,
    TasksUpdate,
    TasksCancel,
}

impl RequestKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RequestKind::ToolsCall => "tools/call",
            RequestKind::ToolsList => "tools/list",
            RequestKind::PromptsList => "prompts/list",
            RequestKind::PromptsGet => "prompts/get",
            RequestKind::ResourcesList => "resources/list",
            RequestKind::ResourceTemplatesList => "resources/templates/list",
            RequestKind::ResourcesRead => "resources/read",
            RequestKind::ResourcesSubscribe => "resources/subscribe",
            RequestKind::ResourcesUnsubscribe => "resources/unsubscribe",
            RequestKind::Complete => "completion/complete",
            RequestKind::EnableServer => "enable_server",
            RequestKind::DisableServer => "disable_server",
            RequestKind::ExecuteCode => "execute_code",
            RequestKind::TasksGet => "tasks/get",
            RequestKind::TasksUpdate => "tasks/update",
            RequestKind::TasksCancel => "tasks/cancel",
        }
    }

    /// The token action the kind needs: listings and a caller's own server
    /// switches are discovery; what reads or runs something upstream is a
    /// call; a script is code.
    pub fn action(self) -> Action {
        match self {
            RequestKind::ToolsList
            | RequestKind::PromptsList
            | RequestKind::ResourcesList
            | RequestKind::ResourceTemplatesList
            | RequestKind::EnableServer
            | RequestKind::DisableServer => Action::Discover,
            RequestKind::ToolsCall
            | RequestKind::PromptsGet
            | RequestKind::ResourcesRead
            | RequestKind::ResourcesSubscribe
            | RequestKind::ResourcesUnsubscribe
            | RequestKind::Complete
            | RequestKind::TasksGet
            | RequestKind::TasksUpdate
            | RequestKind::TasksCancel => Action::Call,
            RequestKind::ExecuteCode => Action::Code,
        }
    }

    /// Whether the request has an upstream do something for the caller,
    /// so rate limits and approvals apply (as they do to a tool call).
    pub(crate) fn uses_upstream(self) -> bool {
        matches!(
            self,
            RequestKind::ToolsCall
                | RequestKind::PromptsGet
                | RequestKind::ResourcesRead
                | RequestKind::ResourcesSubscribe
                | RequestKind::Complete
        )
    }
}

/// What a rule matches a request on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    pub server: String,
    /// The name policies' `tool` globs see: a prompt's upstream name, or
    /// `*` for a whole server.
    pub name: String,
    /// The name token scopes see, and the activity audit records.
    pub qualified: String,
    /// `None` matches only rules for any tier.
    tier: Option<RiskTier>,
}

impl Subject {
    /// A prompt, by its qualified (exposed) name, like a tool.
    pub fn prompt(server: &str, upstream_name: &str, qualified: &str) -> Subject {
        Subject {
            server: server.to_string(),
            name: upstream_name.to_string(),
            qualified: qualified.to_string(),
            tier: Some(RiskTier::ReadOnly),
        }
    }

    fn target(&self) -> Target<'_> {
        Target::named(&self.server, &self.name)
    }

    /// A resource or resource template of `server`: matched as `server__*`.
    pub fn resources(server: &str) -> Subject {
        Subject {
            tier: Some(RiskTier::ReadOnly),
            ..Subject::server(server)
        }
    }

    /// A whole server, as a caller's own server switch names it.
    pub fn server(server: &str) -> Subject {
        Subject {
            server: server.to_string(),
            name: "*".to_string(),
            qualified: format!("{server}__*"),
            tier: None,
        }
    }
}

/// One caller's rules, taken from the governance snapshot once for one
/// request.
#[derive(Debug, Clone)]
pub struct Rules {
    /// The token's scopes; `None` for a caller without a token.
    pub(crate) scopes: Option<Vec<String>>,
    pub(crate) token_id: Option<String>,
    pub(crate) user: Option<String>,
    pub(crate) groups: Arc<BTreeSet<String>>,
    pub(crate) policies: Arc<Vec<Policy>>,
    pub(crate) default: Effect,
    /// The snapshot's remembered verdicts, which `policies` decided.
    pub(crate) verdicts: Arc<Verdicts>,
}

impl Rules {
    fn in_scope(&self, qualified: &str) -> bool {
        self.scopes
            .as_ref()
            .is_none_or(|scopes| scopes.iter().any(|s| glob_match(s, qualified)))
    }

    fn verdict(&self, subject: &Subject) -> Verdict {
        let who = policy::Subject {
            token_id: self.token_id.as_deref(),
            user: self.user.as_deref(),
            groups: &self.groups,
        };
        let asked = (who, subject.target(), subject.tier);
        self.verdicts.get_or(asked, || self.evaluate(who, subject))
    }

    fn evaluate(&self, who: policy::Subject<'_>, subject: &Subject) -> Verdict {
        let policies = self
            .policies
            .iter()
            .filter(|p| p.matches_tool(&subject.server, &subject.name, subject.tier));
        // `evaluate` matches the tier itself; give it one `matches_tool`
        // already accepted (any tier matches a rule for any tier).
        let tier = subject.tier.unwrap_or(RiskTier::Destructive);
        evaluate(policies, who, subject.target(), tier, self.default)
    }

    /// The verdict for `subject`, or why it is refused (scope, deny).
    pub fn check(&self, subject: &Subject) -> Result<Verdict, Refusal> {
        if !self.in_scope(&subject.qualified) {
            return Err(Refusal::Denied { policy: None });
        }
        let verdict = self.verdict(subject);
        if verdict.effect == Effect::Deny {
            return Err(Refusal::Denied {
                policy: verdict.policy_id,
            });
        }
        Ok(verdict)
    }

    /// Whether a listing may show `subject`.
    pub fn shows(&self, subject: &Subject) -> bool {
        self.check(subject).is_ok()
    }
}

impl Governance {
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
        self.check_rate_limits(
            &verdict,
            caller,
            &subject.server,
            &subject.qualified,
            super::authorize::Wide::Count,
        )
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use manifold_store::{PrincipalSelector, TierSelector};

    fn rule(server: &str, tool: &str, tier: TierSelector, effect: Effect) -> Policy {
        Policy {
            id: format!("{server}/{tool}/{effect:?}"),
            principal: PrincipalSelector::Everyone,
            server_glob: server.into(),
            tool_glob: tool.into(),
            tier,
            effect,
            description: String::new(),
            created_at: 0,
        }
    }

    fn rules(scopes: &[&str], policies: Vec<Policy>) -> Rules {
        Rules {
            scopes: Some(scopes.iter().map(|s| s.to_string()).collect()),
            token_id: Some("t".into()),
            user: None,
            groups: Default::default(),
            policies: Arc::new(policies),
            default: Effect::Allow,
            verdicts: Default::default(),
        }
    }

    /// Callers that differ only in one policy input share a snapshot's
    /// remembered verdicts yet each get their own, whichever asks first.
    #[test]
    fn remembered_verdicts_are_per_caller_and_tool() {
        let mut deny = rule("files", "delete", TierSelector::Any, Effect::Deny);
        deny.principal = PrincipalSelector::Group("contractors".into());
        let mut approve = rule("files", "*", TierSelector::Any, Effect::RequireApproval);
        approve.principal = PrincipalSelector::User("ann".into());
        let staff = rules(&["*"], vec![deny, approve]);
        let contractor = Rules {
            groups: Arc::new(["contractors".to_string()].into()),
            ..staff.clone()
        };
        let ann = Rules {
            token_id: None,
            user: Some("ann".into()),
            ..staff.clone()
        };
        let tool = |name: &str, tier| Subject {
            server: "files".into(),
            name: name.into(),
            qualified: format!("files__{name}"),
            tier: Some(tier),
        };
        let delete = tool("delete", RiskTier::Destructive);
        let read = tool("read", RiskTier::ReadOnly);
        for _ in 0..2 {
            assert!(staff.check(&delete).is_ok());
            assert!(contractor.check(&delete).is_err());
            assert!(contractor.check(&read).is_ok());
            assert_eq!(ann.check(&read).unwrap().effect, Effect::RequireApproval);
            assert_eq!(staff.check(&read).unwrap().effect, Effect::Allow);
        }
        // Every (caller, tool) pair asked was evaluated once and remembered.
        assert_eq!(staff.verdicts.len(), 5);
    }

    #[test]
    fn prompts_match_like_tools_and_resources_by_server() {
        let r = rules(&["time__*"], vec![]);
        assert!(r.shows(&Subject::prompt("time", "p", "time__p")));
        assert!(r.shows(&Subject::resources("time")));
        assert!(!r.shows(&Subject::prompt("everything", "p", "everything__p")));
        assert!(!r.shows(&Subject::resources("everything")));
        // A scope naming one tool does not open the server's resources.
        let narrow = rules(&["time__get_time"], vec![]);
        assert!(!narrow.shows(&Subject::resources("time")));
    }

    #[test]
    fn only_rules_on_the_whole_server_refuse_its_resources() {
        let deny_server = rules(
            &["*"],
            vec![rule("everything", "*", TierSelector::Any, Effect::Deny)],
        );
        assert!(!deny_server.shows(&Subject::resources("everything")));
        assert!(!deny_server.shows(&Subject::server("everything")));
        assert!(!deny_server.shows(&Subject::prompt("everything", "p", "everything__p")));
        let deny_tool = rules(
            &["*"],
            vec![rule("everything", "echo", TierSelector::Any, Effect::Deny)],
        );
        assert!(deny_tool.shows(&Subject::resources("everything")));
        assert!(deny_tool.shows(&Subject::prompt("everything", "p", "everything__p")));
        assert!(!deny_tool.shows(&Subject::prompt("everything", "echo", "everything__echo")));
        // Prompts and resources read; a rule on destructive tools leaves them.
        let deny_destructive = rules(
            &["*"],
            vec![rule(
                "*",
                "*",
                TierSelector::Only(RiskTier::Destructive),
                Effect::Deny,
            )],
        );
        assert!(deny_destructive.shows(&Subject::resources("everything")));
        assert!(deny_destructive.shows(&Subject::server("everything")));
        let deny_reads = rules(
            &["*"],
            vec![rule(
                "*",
                "*",
                TierSelector::Only(RiskTier::ReadOnly),
                Effect::Deny,
            )],
        );
        assert!(!deny_reads.shows(&Subject::resources("everything")));
        assert!(deny_reads.shows(&Subject::server("everything")));
    }
}
