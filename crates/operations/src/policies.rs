//! Policy rules: the API's text form, checked and turned into the store's.

use manifold_store::{Effect, NewPolicy, Policy, PrincipalSelector, Store, TierSelector};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{AdminError, Result, format_ms};

/// A rule to create, or the new contents of one.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyInput {
    /// `allow`, `deny`, `require_approval` or `rate_limit`.
    pub effect: String,
    /// `*`, `token:<id>`, `user:<id>` or `group:<name>`. Default `*`.
    pub principal: Option<String>,
    /// Glob over server names. Default `*`.
    pub server: Option<String>,
    /// Glob over tool names (unqualified). Default `*`.
    pub tool: Option<String>,
    /// `any`, `read_only`, `write` or `destructive`. Default `any`.
    pub tier: Option<String>,
    /// Calls per window (rate_limit only).
    pub limit: Option<u32>,
    /// Window length in seconds (rate_limit only).
    pub window_seconds: Option<u32>,
    pub description: Option<String>,
}

/// A stored rule.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PolicyInfo {
    pub id: String,
    pub principal: String,
    pub server: String,
    pub tool: String,
    pub tier: String,
    pub effect: String,
    pub limit: Option<u32>,
    pub window_seconds: Option<u32>,
    pub description: String,
    pub created_at: i64,
    /// RFC 3339.
    pub created: String,
}

fn nonempty(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

pub fn new_policy(input: &PolicyInput) -> Result<NewPolicy> {
    let effect = match (input.effect.as_str(), input.limit, input.window_seconds) {
        ("rate_limit", Some(limit), Some(window_seconds)) => Effect::RateLimit {
            limit,
            window_seconds,
        },
        ("rate_limit", _, _) => {
            return Err(AdminError::Invalid(
                "effect rate_limit needs limit and window".into(),
            ));
        }
        (_, Some(_), _) | (_, _, Some(_)) => {
            return Err(AdminError::Invalid(
                "limit and window apply only to effect rate_limit".into(),
            ));
        }
        ("allow", ..) => Effect::Allow,
        ("deny", ..) => Effect::Deny,
        ("require_approval", ..) => Effect::RequireApproval,
        (other, ..) => {
            return Err(AdminError::Invalid(format!(
                "unknown effect '{other}' (expected allow, deny, require_approval or rate_limit)"
            )));
        }
    };
    let principal: PrincipalSelector = nonempty(&input.principal).unwrap_or("*").parse()?;
    let tier: TierSelector = nonempty(&input.tier).unwrap_or("any").parse()?;
    Ok(NewPolicy {
        principal,
        server_glob: nonempty(&input.server).unwrap_or("*").to_string(),
        tool_glob: nonempty(&input.tool).unwrap_or("*").to_string(),
        tier,
        effect,
        description: input.description.clone().unwrap_or_default(),
    })
}

pub fn principal_text(p: &PrincipalSelector) -> String {
    p.to_string()
}

pub fn tier_text(t: TierSelector) -> &'static str {
    match t {
        TierSelector::Any => "any",
        TierSelector::Only(tier) => tier.as_str(),
    }
}

pub fn effect_name(e: Effect) -> &'static str {
    match e {
        Effect::Allow => "allow",
        Effect::Deny => "deny",
        Effect::RequireApproval => "require_approval",
        Effect::RateLimit { .. } => "rate_limit",
    }
}

pub fn policy_info(p: &Policy) -> PolicyInfo {
    let (limit, window_seconds) = match p.effect {
        Effect::RateLimit {
            limit,
            window_seconds,
        } => (Some(limit), Some(window_seconds)),
        _ => (None, None),
    };
    PolicyInfo {
        id: p.id.clone(),
        principal: principal_text(&p.principal),
        server: p.server_glob.clone(),
        tool: p.tool_glob.clone(),
        tier: tier_text(p.tier).to_string(),
        effect: effect_name(p.effect).to_string(),
        limit,
        window_seconds,
        description: p.description.clone(),
        created_at: p.created_at,
        created: format_ms(p.created_at),
    }
}

pub async fn list_policies(store: &Store) -> Result<Vec<PolicyInfo>> {
    Ok(store
        .list_policies()
        .await?
        .iter()
        .map(policy_info)
        .collect())
}

pub async fn create_policy(store: &Store, input: &PolicyInput) -> Result<PolicyInfo> {
    Ok(policy_info(&store.create_policy(new_policy(input)?).await?))
}

pub async fn update_policy(store: &Store, id: &str, input: &PolicyInput) -> Result<PolicyInfo> {
    Ok(policy_info(
        &store.update_policy(id, new_policy(input)?).await?,
    ))
}

pub async fn delete_policy(store: &Store, id: &str) -> Result<()> {
    if store.delete_policy(id).await? {
        Ok(())
    } else {
        Err(AdminError::NotFound(format!("no policy with id '{id}'")))
    }
}
