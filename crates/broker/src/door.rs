//! The one door: every downstream request that reaches an upstream, not
//! only `tools/call`, is decided here first.
//!
//! A surface asks for a decision (`allow_prompt`, `allow_read`, ...) and
//! gets an [`Allowed`], or a refusal that is already in the activity audit.
//! `Allowed` has private fields, so only this crate makes one, and every
//! function that sends a request upstream on a caller's behalf
//! ([`Broker::get_prompt`], [`Broker::read_resource`], [`Broker::complete`],
//! [`Broker::subscribe`], [`Broker::enable_server`]) takes one. The
//! upstreams an `Allowed` names are resolved by the broker, never handed to
//! the surface.
//!
//! How the rules read each kind:
//! - a prompt matches token scopes and policies by its qualified name
//!   (`server__prompt`), like a tool;
//! - a resource or resource template matches by its server, as `server__*`
//!   (a policy on the server with `tool = "*"`);
//! - both are read-only for tier rules;
//! - a completion follows the prompt or resource it completes, a
//!   subscription the resource;
//! - a server switch in a caller's own view matches the server as
//!   `server__*` at any tier: only a rule on the whole server refuses it;
//! - `execute_code` needs the token's `code` action.

use std::sync::Arc;

use manifold_catalog::{Listed, Principal};
use manifold_upstream::{CallContext, Upstream, UpstreamError};
use rmcp::model::{
    CompleteRequestParams, CompleteResult, GetPromptRequestParams, GetPromptResponse, JsonObject,
    Prompt, ReadResourceRequestParams, ReadResourceResponse, Reference, Resource, ResourceTemplate,
    ServerCapabilities,
};
use serde_json::json;

use crate::{
    Broker, BrokerError,
    governance::{
        caller::Caller,
        refusal::Refusal,
        rules::{RequestKind, Rules, Subject},
    },
    returned::{Answered, uri_arguments},
};

/// A request the broker let through, and the upstreams it may go to, best
/// first. Only the broker makes one.
pub struct Allowed {
    kind: RequestKind,
    upstreams: Vec<Arc<Upstream>>,
    /// The prompt's name upstream, for a prompt or its completion.
    upstream_name: Option<String>,
    /// The server of a server switch.
    server: Option<String>,
}

impl Allowed {
    pub fn kind(&self) -> RequestKind {
        self.kind
    }

    /// How many upstreams the request may be tried on, in order.
    pub fn targets(&self) -> usize {
        self.upstreams.len()
    }

    fn only(kind: RequestKind) -> Allowed {
        Allowed {
            kind,
            upstreams: Vec::new(),
            upstream_name: None,
            server: None,
        }
    }

    /// The upstream number `attempt` of a decision for `kind`: a decision
    /// for one kind never opens the door to another.
    fn upstream(&self, kind: RequestKind, attempt: usize) -> Option<&Arc<Upstream>> {
        self.upstreams.get(attempt).filter(|_| self.kind == kind)
    }

    // The callers return `UpstreamError` already; boxing it here buys nothing.
    #[allow(clippy::result_large_err)]
    fn target(&self, kind: RequestKind, attempt: usize) -> Result<&Arc<Upstream>, UpstreamError> {
        self.upstream(kind, attempt)
            .ok_or_else(|| UpstreamError::Protocol {
                server: String::new(),
                message: format!(
                    "a decision for {} does not send {} (to upstream {attempt})",
                    self.kind.as_str(),
                    kind.as_str()
                ),
            })
    }
}

fn unknown(what: &'static str, name: &str) -> BrokerError {
    BrokerError::Unknown {
        what,
        name: name.to_string(),
    }
}

impl Broker {
    /// Whether any connected upstream declares a capability (what the
    /// gateway itself declares in direct mode).
    pub fn any_declares(&self, declared: impl Fn(&ServerCapabilities) -> bool) -> bool {
        self.primitives.any_declares(declared)
    }

    /// Refuses `kind` for `caller` unless its current token allows the
    /// kind's action; the refusal is recorded.
    pub(crate) async fn rules_for(
        &self,
        caller: &Caller,
        kind: RequestKind,
        named: &str,
        arguments: &JsonObject,
    ) -> Result<Rules, Refusal> {
        match self.governance.rules(caller, kind.action()).await {
            Ok(rules) => Ok(rules),
            Err(refusal) => {
                self.governance
                    .record_refusal(caller, kind.as_str(), named, arguments, &refusal)
                    .await;
                Err(refusal)
            }
        }
    }

    pub(crate) async fn decide_request(
        &self,
        rules: &Rules,
        caller: &Caller,
        kind: RequestKind,
        subject: &Subject,
        arguments: &JsonObject,
    ) -> Result<(), Refusal> {
        self.governance
            .decide(rules, caller, kind, subject, arguments)
            .await
    }

    /// The prompts `caller` may use, under their exposed names.
    pub async fn list_prompts(&self, caller: &Caller) -> Result<Vec<Prompt>, Refusal> {
        let kind = RequestKind::PromptsList;
        let rules = self.rules_for(caller, kind, "", &JsonObject::new()).await?;
        let listed = self.primitives.list_prompts().await;
        Ok(listed
            .into_iter()
            .filter(|l| rules.shows(&Subject::prompt(&l.server, &l.name, &l.item.name)))
            .map(|l| l.item)
            .collect())
    }

    /// The resources `caller` may read.
    pub async fn list_resources(&self, caller: &Caller) -> Result<Vec<Resource>, Refusal> {
        let kind = RequestKind::ResourcesList;
        let rules = self.rules_for(caller, kind, "", &JsonObject::new()).await?;
        Ok(shown(&rules, self.primitives.list_resources().await))
    }

    /// The resource templates `caller` may read through.
    pub async fn list_resource_templates(
        &self,
        caller: &Caller,
    ) -> Result<Vec<ResourceTemplate>, Refusal> {
        let kind = RequestKind::ResourceTemplatesList;
        let rules = self.rules_for(caller, kind, "", &JsonObject::new()).await?;
        Ok(shown(
            &rules,
            self.primitives.list_resource_templates().await,
        ))
    }

    /// Decides `prompts/get` of the prompt exposed as `name`.
    pub async fn allow_prompt(
        &self,
        caller: &Caller,
        name: &str,
        arguments: Option<&JsonObject>,
    ) -> Result<Allowed, BrokerError> {
        self.allow_prompt_as(RequestKind::PromptsGet, caller, name, arguments)
            .await
    }

    async fn allow_prompt_as(
        &self,
        kind: RequestKind,
        caller: &Caller,
        name: &str,
        arguments: Option<&JsonObject>,
    ) -> Result<Allowed, BrokerError> {
        let empty = JsonObject::new();
        let arguments = arguments.unwrap_or(&empty);
        let rules = self.rules_for(caller, kind, name, arguments).await?;
        // Decided on what the name says, before any upstream hears of it.
        let (server, upstream_name, listed) = match self.primitives.prompt_route(name) {
            Some(route) => route,
            None => {
                let (server, upstream_name) = self
                    .primitives
                    .find_prompt(name)
                    .await
                    .ok_or_else(|| unknown("prompt", name))?;
                (server, upstream_name, true)
            }
        };
        let subject = Subject::prompt(&server, &upstream_name, name);
        self.decide_request(&rules, caller, kind, &subject, arguments)
            .await?;
        // A name only split may be a shortened one: the listing knows.
        let upstream_name = match listed {
            true => upstream_name,
            false => self
                .primitives
                .find_prompt(name)
                .await
                .map_or(upstream_name, |(_, n)| n),
        };
        let upstream = self
            .primitives
            .upstream(&server)
            .ok_or_else(|| unknown("prompt", name))?;
        Ok(Allowed {
            kind,
            upstreams: vec![upstream],
            upstream_name: Some(upstream_name),
            server: Some(server),
        })
    }

    /// Decides `resources/read` of `uri`: of the servers that may have it,
    /// those the caller may read from, best first.
    pub async fn allow_read(&self, caller: &Caller, uri: &str) -> Result<Allowed, BrokerError> {
        self.allow_resource(RequestKind::ResourcesRead, caller, uri)
            .await
    }

    /// Decides `resources/subscribe` or `resources/unsubscribe` (or a
    /// 2026-07-28 listen stream's resource subscription) of `uri`: as a
    /// read of it.
    pub async fn allow_subscription(
        &self,
        caller: &Caller,
        kind: RequestKind,
        uri: &str,
    ) -> Result<Allowed, BrokerError> {
        debug_assert!(matches!(
            kind,
            RequestKind::ResourcesSubscribe | RequestKind::ResourcesUnsubscribe
        ));
        self.allow_resource(kind, caller, uri).await
    }

    async fn allow_resource(
        &self,
        kind: RequestKind,
        caller: &Caller,
        uri: &str,
    ) -> Result<Allowed, BrokerError> {
        // The URI is kept as a hash, like arguments.
        let arguments = json!({ "uri": uri });
        let arguments = arguments.as_object().expect("an object literal");
        let rules = self.rules_for(caller, kind, "*", arguments).await?;
        let servers = self.primitives.resource_servers(uri).await;
        self.allow_servers(&rules, caller, kind, servers, arguments)
            .await?
            .ok_or_else(|| unknown("resource", uri))
    }

    /// Keeps the servers `rules` let the caller use, and decides the
    /// request on the first of them. `None` when there was no server.
    async fn allow_servers(
        &self,
        rules: &Rules,
        caller: &Caller,
        kind: RequestKind,
        servers: Vec<String>,
        arguments: &JsonObject,
    ) -> Result<Option<Allowed>, Refusal> {
        let Some(first) = servers.first() else {
            return Ok(None);
        };
        let allowed: Vec<&String> = servers
            .iter()
            .filter(|s| rules.shows(&Subject::resources(s)))
            .collect();
        // With none left, the refusal names the likeliest server.
        let decided = allowed.first().copied().unwrap_or(first);
        self.decide_request(rules, caller, kind, &Subject::resources(decided), arguments)
            .await?;
        Ok(Some(Allowed {
            kind,
            upstreams: allowed
                .iter()
                .filter_map(|s| self.primitives.upstream(s))
                .collect(),
            upstream_name: None,
            server: Some(decided.clone()),
        }))
    }

    /// Decides `completion/complete`: as the prompt or resource template it
    /// completes.
    pub async fn allow_completion(
        &self,
        caller: &Caller,
        reference: &Reference,
    ) -> Result<Allowed, BrokerError> {
        let kind = RequestKind::Complete;
        match reference {
            Reference::Prompt(prompt) => {
                self.allow_prompt_as(kind, caller, &prompt.name, None).await
            }
            Reference::Resource(resource) => {
                let arguments = json!({ "uri": resource.uri });
                let arguments = arguments.as_object().expect("an object literal");
                let rules = self.rules_for(caller, kind, "*", arguments).await?;
                let servers = match self.primitives.template_server(&resource.uri).await {
                    Some(server) => vec![server],
                    None => self
                        .primitives
                        .resource_servers(&resource.uri)
                        .await
                        .into_iter()
                        .take(1)
                        .collect(),
                };
                self.allow_servers(&rules, caller, kind, servers, arguments)
                    .await?
                    .ok_or_else(|| unknown("resource", &resource.uri))
            }
            _ => Err(unknown("completion reference", "(unsupported)")),
        }
    }

    /// Decides `enable_server` or `disable_server` on `server` in the
    /// caller's own view. Nothing connects before this says yes.
    pub async fn allow_server_switch(
        &self,
        caller: &Caller,
        kind: RequestKind,
        server: &str,
    ) -> Result<Allowed, BrokerError> {
        debug_assert!(matches!(
            kind,
            RequestKind::EnableServer | RequestKind::DisableServer
        ));
        let subject = Subject::server(server);
        let arguments = JsonObject::new();
        let rules = self
            .rules_for(caller, kind, &subject.qualified, &arguments)
            .await?;
        if self.catalog.upstream(server).is_none() {
            return Err(unknown("server", server));
        }
        self.decide_request(&rules, caller, kind, &subject, &arguments)
            .await?;
        Ok(Allowed {
            server: Some(server.to_string()),
            ..Allowed::only(kind)
        })
    }

    /// A call to `name`, which `view` lacks because the caller has not
    /// signed in to the per-principal server it belongs to: once the caller
    /// may switch that server on (the decision `enable_server` gets), its
    /// sign-in starts and the answer is `auth_required` with the URL. `None`
    /// when that is not the case.
    pub(crate) async fn sign_in_first(
        &self,
        view: &manifold_catalog::CatalogView,
        caller: &Caller,
        name: &str,
    ) -> Option<BrokerError> {
        let server = view.servers.iter().find(|s| {
            s.tools.is_empty()
                && s.error
                    .as_deref()
                    .is_some_and(|e| e.starts_with("auth_required"))
                && name
                    .strip_prefix(s.name.as_str())
                    .is_some_and(|rest| rest.starts_with("__"))
        })?;
        let upstream = self.catalog.upstream(&server.name)?;
        if !upstream.per_principal() {
            return None;
        }
        if let Err(refusal) = self
            .allow_server_switch(caller, RequestKind::EnableServer, &server.name)
            .await
        {
            return Some(refusal);
        }
        let answer = upstream.sign_in_required(&caller.principal.0).await;
        self.governance
            .record_call(
                caller,
                name,
                &JsonObject::new(),
                manifold_store::hash_arguments(&serde_json::Value::Object(JsonObject::new())),
                manifold_store::Decision::Allowed,
                None,
                manifold_store::CallOutcome::NotForwarded,
                std::time::Duration::ZERO,
                0,
                json!({
                    "refusal": "auth_required",
                    "kind": RequestKind::ToolsCall.as_str(),
                    "credential": caller.principal.0,
                }),
            )
            .await
            .ok();
        Some(answer.into())
    }

    /// Decides `execute_code`: the token needs the `code` action. Each call
    /// the script makes is decided again, as a tool call.
    pub async fn allow_code(&self, caller: &Caller) -> Result<Allowed, Refusal> {
        let kind = RequestKind::ExecuteCode;
        self.rules_for(caller, kind, kind.as_str(), &JsonObject::new())
            .await?;
        Ok(Allowed::only(kind))
    }

    /// `prompts/get` upstream, as allowed. `params` carries the exposed
    /// name; the upstream gets its own. What comes back is guarded and
    /// recorded (`returned.rs`).
    pub async fn get_prompt(
        &self,
        caller: &Caller,
        allowed: &Allowed,
        mut params: GetPromptRequestParams,
        context: &CallContext,
    ) -> Result<GetPromptResponse, BrokerError> {
        let started = std::time::Instant::now();
        let upstream = allowed.target(RequestKind::PromptsGet, 0)?;
        params.meta = None;
        let exposed = std::mem::take(&mut params.name);
        params.name = allowed.upstream_name.clone().unwrap_or(exposed.clone());
        let arguments = params.arguments.clone().unwrap_or_default();
        let result = upstream.get_prompt(params, context).await;
        let answered = Answered {
            caller,
            kind: RequestKind::PromptsGet,
            named: &exposed,
            arguments: &arguments,
            started,
        };
        self.returned(answered, upstream, result).await
    }

    /// `resources/read` upstream on the allowed server number `attempt`;
    /// guarded and recorded like a prompt.
    pub async fn read_resource(
        &self,
        caller: &Caller,
        allowed: &Allowed,
        attempt: usize,
        mut params: ReadResourceRequestParams,
        context: &CallContext,
    ) -> Result<ReadResourceResponse, BrokerError> {
        let started = std::time::Instant::now();
        let upstream = allowed.target(RequestKind::ResourcesRead, attempt)?;
        params.meta = None;
        let arguments = uri_arguments(&params.uri);
        let result = upstream.read_resource(params, context).await;
        let named = Subject::resources(upstream.name()).qualified;
        let answered = Answered {
            caller,
            kind: RequestKind::ResourcesRead,
            named: &named,
            arguments: &arguments,
            started,
        };
        self.returned(answered, upstream, result).await
    }

    /// `completion/complete` upstream, as allowed; guarded and recorded like
    /// a prompt.
    pub async fn complete(
        &self,
        caller: &Caller,
        allowed: &Allowed,
        mut params: CompleteRequestParams,
        context: &CallContext,
    ) -> Result<CompleteResult, BrokerError> {
        let started = std::time::Instant::now();
        let upstream = allowed.target(RequestKind::Complete, 0)?;
        params.meta = None;
        let (named, arguments) = match &mut params.r#ref {
            Reference::Prompt(prompt) => {
                let exposed = prompt.name.clone();
                if let Some(name) = &allowed.upstream_name {
                    prompt.name = name.clone();
                }
                (exposed, JsonObject::new())
            }
            Reference::Resource(resource) => (
                Subject::resources(upstream.name()).qualified,
                uri_arguments(&resource.uri),
            ),
            _ => (
                Subject::resources(upstream.name()).qualified,
                JsonObject::new(),
            ),
        };
        let result = upstream.complete(params, context).await;
        let answered = Answered {
            caller,
            kind: RequestKind::Complete,
            named: &named,
            arguments: &arguments,
            started,
        };
        self.returned(answered, upstream, result).await
    }

    /// `resources/subscribe` upstream (legacy upstreams that support it).
    /// Returns whether the upstream took it.
    pub async fn subscribe(&self, allowed: &Allowed, uri: &str) -> Result<bool, UpstreamError> {
        let Some(upstream) = allowed.upstream(RequestKind::ResourcesSubscribe, 0) else {
            return Ok(false);
        };
        upstream.subscribe(uri).await
    }

    /// Puts the allowed server in `principal`'s view, connecting it (and
    /// starting a stdio server) if needed. Returns its tool count.
    pub async fn enable_server(
        &self,
        allowed: &Allowed,
        principal: &Principal,
    ) -> Result<usize, UpstreamError> {
        let server = switched(allowed, RequestKind::EnableServer).ok_or_else(|| {
            UpstreamError::Protocol {
                server: String::new(),
                message: format!(
                    "a decision for {} cannot enable a server",
                    allowed.kind.as_str()
                ),
            }
        })?;
        match self.catalog.enable_for(server, principal).await {
            // A per-principal server the caller has not signed in to: the
            // switch was allowed, so its sign-in starts.
            Err(UpstreamError::Protocol { message, .. })
                if message.starts_with("auth_required") =>
            {
                match self.catalog.upstream(server) {
                    Some(upstream) if upstream.per_principal() => {
                        Err(upstream.sign_in_required(&principal.0).await)
                    }
                    _ => Err(UpstreamError::Protocol {
                        server: server.to_string(),
                        message,
                    }),
                }
            }
            other => other,
        }
    }

    /// Takes the allowed server out of `principal`'s view. False when the
    /// decision was not for this, or there is no such server any more.
    pub fn disable_server(&self, allowed: &Allowed, principal: &Principal) -> bool {
        switched(allowed, RequestKind::DisableServer)
            .is_some_and(|server| self.catalog.disable_for(server, principal))
    }
}

/// The server a switch decision names, if it is a decision for `kind`.
fn switched(allowed: &Allowed, kind: RequestKind) -> Option<&str> {
    allowed.server.as_deref().filter(|_| allowed.kind == kind)
}

/// The items whose server `rules` let the caller read from.
fn shown<T>(rules: &Rules, listed: Vec<Listed<T>>) -> Vec<T> {
    listed
        .into_iter()
        .filter(|l| rules.shows(&Subject::resources(&l.server)))
        .map(|l| l.item)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_for_one_kind_sends_nothing_else() {
        let allowed = Allowed {
            server: Some("time".into()),
            ..Allowed::only(RequestKind::DisableServer)
        };
        assert_eq!(switched(&allowed, RequestKind::EnableServer), None);
        assert_eq!(switched(&allowed, RequestKind::DisableServer), Some("time"));
        assert!(allowed.upstream(RequestKind::PromptsGet, 0).is_none());
    }
}
