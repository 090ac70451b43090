//! Policy rules and the one-shot load of everything a policy decision needs.
//!
//! A rule says: for these principals, on tools matching these globs, of this
//! risk tier, apply this effect. The store keeps rules; the broker evaluates
//! them. [`Store::load_policy_inputs`] reads policies, tool classifications
//! and token groups in one statement per table, whatever the catalog size.

use std::{
    collections::{BTreeMap, BTreeSet},
    str::FromStr,
};

use serde::Serialize;
use sqlx::{Row, any::AnyRow};

use crate::{
    Result, Store, StoreError, glob_match, now_ms, random_id,
    tokens::validate_group,
    tools::{RiskTier, ToolClassification},
};

/// Which tiers a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum TierSelector {
    Any,
    Only(RiskTier),
}

impl TierSelector {
    /// Whether a tool of tier `tier` (`None`: not classified) is selected.
    /// An unclassified tool is selected only by `Any`.
    pub fn matches(self, tier: Option<RiskTier>) -> bool {
        match self {
            TierSelector::Any => true,
            TierSelector::Only(want) => tier == Some(want),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            TierSelector::Any => "any",
            TierSelector::Only(tier) => tier.as_str(),
        }
    }

    fn parse(s: &str) -> Result<TierSelector> {
        if s == "any" {
            Ok(TierSelector::Any)
        } else {
            s.parse().map(TierSelector::Only)
        }
    }
}

/// Whom a rule applies to. Stored as `*`, `token:<id>`, `user:<id>` or
/// `group:<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub enum PrincipalSelector {
    Everyone,
    Token(String),
    /// A caller signed in with the identity provider, by its principal claim.
    User(String),
    Group(String),
}

impl PrincipalSelector {
    /// Whether a caller holding `token_id` (if any), signed in as `user`
    /// (if so), in `groups`, is selected.
    pub fn matches(
        &self,
        token_id: Option<&str>,
        user: Option<&str>,
        groups: &BTreeSet<String>,
    ) -> bool {
        match self {
            PrincipalSelector::Everyone => true,
            PrincipalSelector::Token(id) => token_id == Some(id.as_str()),
            PrincipalSelector::User(id) => user == Some(id.as_str()),
            PrincipalSelector::Group(group) => groups.contains(group),
        }
    }

    fn to_stored(&self) -> String {
        self.to_string()
    }

    fn from_stored(s: &str) -> Result<PrincipalSelector> {
        if s == "*" {
            Ok(PrincipalSelector::Everyone)
        } else if let Some(id) = s.strip_prefix("token:") {
            Ok(PrincipalSelector::Token(id.to_string()))
        } else if let Some(id) = s.strip_prefix("user:") {
            Ok(PrincipalSelector::User(id.to_string()))
        } else if let Some(group) = s.strip_prefix("group:") {
            Ok(PrincipalSelector::Group(group.to_string()))
        } else {
            Err(StoreError::corrupt("policy principal", s))
        }
    }

    fn validate(&self) -> Result<()> {
        match self {
            PrincipalSelector::Everyone => Ok(()),
            PrincipalSelector::Token(id) if !id.is_empty() => Ok(()),
            PrincipalSelector::Token(_) => {
                Err(StoreError::invalid("policy principal", "empty token id"))
            }
            PrincipalSelector::User(id) if !id.is_empty() && id.len() <= 512 => Ok(()),
            PrincipalSelector::User(_) => Err(StoreError::invalid(
                "policy principal",
                "a user id of 1 to 512 characters",
            )),
            PrincipalSelector::Group(group) => validate_group(group),
        }
    }
}

impl std::fmt::Display for PrincipalSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PrincipalSelector::Everyone => f.write_str("*"),
            PrincipalSelector::Token(id) => write!(f, "token:{id}"),
            PrincipalSelector::User(id) => write!(f, "user:{id}"),
            PrincipalSelector::Group(group) => write!(f, "group:{group}"),
        }
    }
}

impl FromStr for PrincipalSelector {
    type Err = StoreError;

    /// `*`, `token:<id>`, `user:<id>` or `group:<name>`, as the config and
    /// the CLI write it.
    fn from_str(s: &str) -> Result<PrincipalSelector> {
        let selector = PrincipalSelector::from_stored(s).map_err(|_| {
            StoreError::invalid(
                "policy principal",
                format!("'{s}' (expected *, token:<id>, user:<id> or group:<name>)"),
            )
        })?;
        selector.validate()?;
        Ok(selector)
    }
}

impl FromStr for TierSelector {
    type Err = StoreError;

    /// `any`, `read_only`, `write` or `destructive`.
    fn from_str(s: &str) -> Result<TierSelector> {
        TierSelector::parse(s)
    }
}

/// What a matching rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case", tag = "effect")]
pub enum Effect {
    Allow,
    Deny,
    RequireApproval,
    /// At most `limit` calls per `window_seconds` fixed window.
    RateLimit {
        limit: u32,
        window_seconds: u32,
    },
}

impl Effect {
    fn as_str(self) -> &'static str {
        match self {
            Effect::Allow => "allow",
            Effect::Deny => "deny",
            Effect::RequireApproval => "require_approval",
            Effect::RateLimit { .. } => "rate_limit",
        }
    }
}

/// A rule to create, or the new contents of one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPolicy {
    pub principal: PrincipalSelector,
    pub server_glob: String,
    pub tool_glob: String,
    pub tier: TierSelector,
    pub effect: Effect,
    pub description: String,
}

impl NewPolicy {
    /// A rule for everyone, on every tool of every tier.
    pub fn new(effect: Effect) -> NewPolicy {
        NewPolicy {
            principal: PrincipalSelector::Everyone,
            server_glob: "*".to_string(),
            tool_glob: "*".to_string(),
            tier: TierSelector::Any,
            effect,
            description: String::new(),
        }
    }

    fn validate(&self) -> Result<()> {
        self.principal.validate()?;
        for (what, glob) in [
            ("server glob", &self.server_glob),
            ("tool glob", &self.tool_glob),
        ] {
            if glob.is_empty() || glob.chars().any(char::is_whitespace) {
                return Err(StoreError::invalid(what, format!("{glob:?}")));
            }
        }
        if let Effect::RateLimit {
            limit,
            window_seconds,
        } = self.effect
            && (limit == 0 || window_seconds == 0)
        {
            return Err(StoreError::invalid(
                "rate limit",
                "limit and window must be at least 1",
            ));
        }
        Ok(())
    }
}

/// A stored rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Policy {
    pub id: String,
    pub principal: PrincipalSelector,
    pub server_glob: String,
    pub tool_glob: String,
    pub tier: TierSelector,
    pub effect: Effect,
    pub description: String,
    pub created_at: i64,
}

impl Policy {
    /// Whether the rule's server and tool globs and tier match a tool.
    /// Names no server, tool or tier: matches every tool of every server.
    pub fn is_principal_wide(&self) -> bool {
        self.server_glob == "*" && self.tool_glob == "*" && self.tier == TierSelector::Any
    }

    pub fn matches_tool(&self, server: &str, tool: &str, tier: Option<RiskTier>) -> bool {
        glob_match(&self.server_glob, server)
            && glob_match(&self.tool_glob, tool)
            && self.tier.matches(tier)
    }

    fn from_row(row: &AnyRow) -> Result<Policy> {
        let effect_text: String = row.try_get("effect")?;
        let effect = match effect_text.as_str() {
            "allow" => Effect::Allow,
            "deny" => Effect::Deny,
            "require_approval" => Effect::RequireApproval,
            "rate_limit" => {
                let limit: Option<i64> = row.try_get("rate_limit")?;
                let window: Option<i64> = row.try_get("rate_window_seconds")?;
                match (
                    limit.and_then(|l| u32::try_from(l).ok()),
                    window.and_then(|w| u32::try_from(w).ok()),
                ) {
                    (Some(limit), Some(window_seconds)) => Effect::RateLimit {
                        limit,
                        window_seconds,
                    },
                    _ => {
                        return Err(StoreError::corrupt(
                            "policy rate limit",
                            format!("{limit:?}/{window:?}"),
                        ));
                    }
                }
            }
            other => return Err(StoreError::corrupt("policy effect", other)),
        };
        let principal: String = row.try_get("principal")?;
        let tier: String = row.try_get("tier")?;
        Ok(Policy {
            id: row.try_get("id")?,
            principal: PrincipalSelector::from_stored(&principal)?,
            server_glob: row.try_get("server_glob")?,
            tool_glob: row.try_get("tool_glob")?,
            tier: TierSelector::parse(&tier)
                .map_err(|_| StoreError::corrupt("policy tier", tier))?,
            effect,
            description: row.try_get("description")?,
            created_at: row.try_get("created_at")?,
        })
    }
}

/// Everything a policy decision or a filtered listing reads from the store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyInputs {
    /// Oldest first.
    pub policies: Vec<Policy>,
    pub classifications: Vec<ToolClassification>,
    /// Token id to the groups it is in.
    pub token_groups: BTreeMap<String, BTreeSet<String>>,
}

impl PolicyInputs {
    /// The groups of one token (empty if none).
    pub fn groups_of(&self, token_id: &str) -> BTreeSet<String> {
        self.token_groups.get(token_id).cloned().unwrap_or_default()
    }
}

const POLICY_COLUMNS: &str = "id, principal, server_glob, tool_glob, tier, effect, rate_limit, \
                              rate_window_seconds, description, created_at";

fn rate_columns(effect: Effect) -> (Option<i64>, Option<i64>) {
    match effect {
        Effect::RateLimit {
            limit,
            window_seconds,
        } => (Some(i64::from(limit)), Some(i64::from(window_seconds))),
        _ => (None, None),
    }
}

impl Store {
    pub async fn create_policy(&self, new: NewPolicy) -> Result<Policy> {
        new.validate()?;
        let id = random_id::<6>("pol_");
        let created_at = now_ms();
        let (limit, window) = rate_columns(new.effect);
        self.query(
            "INSERT INTO policies (id, principal, server_glob, tool_glob, tier, effect, rate_limit, \
             rate_window_seconds, description, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&id)
        .bind(new.principal.to_stored())
        .bind(&new.server_glob)
        .bind(&new.tool_glob)
        .bind(new.tier.as_str())
        .bind(new.effect.as_str())
        .bind(limit)
        .bind(window)
        .bind(&new.description)
        .bind(created_at)
        .execute(self.pool())
        .await?;
        self.governance_written();
        Ok(Policy {
            id,
            principal: new.principal,
            server_glob: new.server_glob,
            tool_glob: new.tool_glob,
            tier: new.tier,
            effect: new.effect,
            description: new.description,
            created_at,
        })
    }

    pub async fn get_policy(&self, id: &str) -> Result<Option<Policy>> {
        let sql = format!("SELECT {POLICY_COLUMNS} FROM policies WHERE id = $1");
        let row = self
            .query(&sql)
            .bind(id)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(Policy::from_row).transpose()
    }

    /// All rules, oldest first.
    pub async fn list_policies(&self) -> Result<Vec<Policy>> {
        let sql = format!("SELECT {POLICY_COLUMNS} FROM policies ORDER BY created_at, id");
        let rows = self.query(&sql).fetch_all(self.pool()).await?;
        rows.iter().map(Policy::from_row).collect()
    }

    /// Replaces a rule's contents, keeping its id and creation time.
    pub async fn update_policy(&self, id: &str, new: NewPolicy) -> Result<Policy> {
        new.validate()?;
        let (limit, window) = rate_columns(new.effect);
        let sql = format!(
            "UPDATE policies SET principal = $2, server_glob = $3, tool_glob = $4, tier = $5, \
             effect = $6, rate_limit = $7, rate_window_seconds = $8, description = $9 \
             WHERE id = $1 RETURNING {POLICY_COLUMNS}"
        );
        let row = self
            .query(&sql)
            .bind(id)
            .bind(new.principal.to_stored())
            .bind(&new.server_glob)
            .bind(&new.tool_glob)
            .bind(new.tier.as_str())
            .bind(new.effect.as_str())
            .bind(limit)
            .bind(window)
            .bind(&new.description)
            .fetch_optional(self.pool())
            .await?;
        self.governance_written();
        match row {
            Some(row) => Policy::from_row(&row),
            None => Err(StoreError::NotFound {
                what: "policy",
                id: id.to_string(),
            }),
        }
    }

    pub async fn delete_policy(&self, id: &str) -> Result<bool> {
        let done = self
            .query("DELETE FROM policies WHERE id = $1")
            .bind(id)
            .execute(self.pool())
            .await?;
        self.governance_written();
        Ok(done.rows_affected() > 0)
    }

    /// Policies, tool classifications and token groups: three statements,
    /// one per table, however many tools, rules or tokens there are.
    pub async fn load_policy_inputs(&self) -> Result<PolicyInputs> {
        let policies = self.list_policies().await?;
        let classifications = self.list_tool_classifications().await?;
        let rows = self
            .query("SELECT token_id, group_name FROM token_groups")
            .fetch_all(self.pool())
            .await?;
        let mut token_groups: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for row in &rows {
            token_groups
                .entry(row.try_get("token_id")?)
                .or_default()
                .insert(row.try_get("group_name")?);
        }
        Ok(PolicyInputs {
            policies,
            classifications,
            token_groups,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_round_trip_and_match() {
        for sel in [
            PrincipalSelector::Everyone,
            PrincipalSelector::Token("0123456789ab".into()),
            PrincipalSelector::Group("ops".into()),
        ] {
            assert_eq!(
                PrincipalSelector::from_stored(&sel.to_stored()).unwrap(),
                sel
            );
        }
        let groups: BTreeSet<String> = ["ops".to_string()].into();
        assert!(PrincipalSelector::Group("ops".into()).matches(None, None, &groups));
        assert!(!PrincipalSelector::Token("a".into()).matches(Some("b"), None, &groups));
        for tier in ["any", "read_only", "write", "destructive"] {
            assert_eq!(TierSelector::parse(tier).unwrap().as_str(), tier);
        }
        assert!(TierSelector::Any.matches(None));
        assert!(!TierSelector::Only(RiskTier::Write).matches(None));
    }
}
