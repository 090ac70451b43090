//! Who is calling: a gateway token, a user the identity provider signed in,
//! or (auth off) an opaque principal; and, for a code-mode run, which
//! untrusted servers it has read from.

use std::{collections::BTreeSet, sync::Arc};

use manifold_catalog::{CatalogTool, Principal};
use manifold_store::{Action, TokenRecord, now_ms};

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

    /// Who the caller is across requests, sessions and replicas: its gateway
    /// token or its identity-provider subject. `None` with auth off, where a
    /// display name tells nobody apart.
    pub fn identity_key(&self) -> Option<String> {
        match (self.token_id(), self.user_id()) {
            (Some(token), _) => Some(format!("token:{token}")),
            (None, Some(user)) => Some(format!("user:{user}")),
            (None, None) => None,
        }
    }

    /// The owner of the tasks this caller starts: its identity, or with auth
    /// off the one principal every caller is.
    pub fn task_owner(&self) -> String {
        self.identity_key()
            .unwrap_or_else(|| "anonymous".to_string())
    }

    pub fn may(&self, action: Action) -> bool {
        match (&self.token, &self.user) {
            (Some(token), _) => token.allows(action),
            (None, Some(user)) => user.actions.contains(&action),
            (None, None) => true,
        }
    }

    pub(crate) fn in_scope(&self, qualified: &str) -> bool {
        self.token
            .as_ref()
            .is_none_or(|t| t.scope_allows(qualified))
    }

    /// [`Caller::in_scope`] for a tool, by either of its names.
    pub(crate) fn tool_in_scope(&self, tool: &CatalogTool) -> bool {
        scope_allows_tool(|name| self.in_scope(name), tool)
    }
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

    pub(crate) fn untrusted_reads_other_than(&self, server: &str) -> Vec<String> {
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

/// Whether a token's scope allows `tool` by its qualified name or, for a
/// tool the operator renamed, by the qualified name under the upstream's
/// name, which the token may have been scoped to.
pub(crate) fn scope_allows_tool(allows: impl Fn(&str) -> bool, tool: &CatalogTool) -> bool {
    allows(&tool.qualified) || tool.upstream_qualified.as_deref().is_some_and(allows)
}
