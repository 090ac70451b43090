//! Gateway tokens: create (the secret shown once), list, revoke.

use std::collections::BTreeSet;

use manifold_store::{Action, Expiry, NewToken, Store, TokenRecord, now_ms};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{AdminError, Result, format_ms, parse_duration};

/// A token to create.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    pub name: String,
    /// `30d`, `12h`, `90m`, `45s`, seconds, or `never`. Default: 90 days.
    pub expires: Option<String>,
    /// `discover`, `call`, `code`, `admin`. Default: discover, call, code.
    #[serde(default)]
    pub actions: Vec<String>,
    /// Globs over `server__tool`. Default: `*`.
    #[serde(default)]
    pub scopes: Vec<String>,
    #[serde(default)]
    pub groups: Vec<String>,
}

/// A token as listed; the secret is never stored, so never shown.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TokenInfo {
    pub id: String,
    pub name: String,
    pub actions: Vec<String>,
    pub scopes: Vec<String>,
    pub groups: Vec<String>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    /// RFC 3339, or `never`.
    pub expires: String,
    pub revoked_at: Option<i64>,
    /// `active`, `expired` or `revoked`.
    pub state: String,
}

/// A new token with its secret, shown this once; otherwise as listed.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CreatedToken {
    /// `mfd_<id>_<secret>`: send it as `Authorization: Bearer`.
    pub token: String,
    pub id: String,
    pub name: String,
    pub actions: Vec<String>,
    pub scopes: Vec<String>,
    pub groups: Vec<String>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub expires: String,
    pub revoked_at: Option<i64>,
    pub state: String,
}

impl CreatedToken {
    fn new(token: String, info: TokenInfo) -> CreatedToken {
        CreatedToken {
            token,
            id: info.id,
            name: info.name,
            actions: info.actions,
            scopes: info.scopes,
            groups: info.groups,
            created_at: info.created_at,
            expires_at: info.expires_at,
            expires: info.expires,
            revoked_at: info.revoked_at,
            state: info.state,
        }
    }
}

fn token_state(t: &TokenRecord, now: i64) -> &'static str {
    if t.is_revoked() {
        "revoked"
    } else if t.is_expired(now) {
        "expired"
    } else {
        "active"
    }
}

pub fn token_info(t: &TokenRecord, groups: Vec<String>, now: i64) -> TokenInfo {
    TokenInfo {
        id: t.id.clone(),
        name: t.name.clone(),
        actions: t.actions.iter().map(|a| a.as_str().to_string()).collect(),
        scopes: t.scopes.clone(),
        groups,
        created_at: t.created_at,
        expires_at: t.expires_at,
        expires: t.expires_at.map_or_else(|| "never".to_string(), format_ms),
        revoked_at: t.revoked_at,
        state: token_state(t, now).to_string(),
    }
}

pub async fn create_token(store: &Store, request: CreateToken) -> Result<CreatedToken> {
    let expiry = match request.expires.as_deref().map(str::trim) {
        None | Some("") => Expiry::Default,
        Some("never") => Expiry::Never,
        Some(d) => Expiry::After(parse_duration(d)?),
    };
    let actions: BTreeSet<Action> = if request.actions.is_empty() {
        [Action::Discover, Action::Call, Action::Code].into()
    } else {
        request
            .actions
            .iter()
            .map(|a| a.parse::<Action>())
            .collect::<Result<_, _>>()?
    };
    let scopes = if request.scopes.is_empty() {
        vec!["*".to_string()]
    } else {
        request.scopes
    };
    let new = NewToken::new(request.name, actions, scopes).expiry(expiry);
    let (record, secret) = store.create_token(new).await?;
    for group in &request.groups {
        if let Err(e) = store.add_token_group(&record.id, group).await {
            // No half-made token: its secret would never be shown.
            let _ = store.delete_token(&record.id).await;
            return Err(e.into());
        }
    }
    let groups: BTreeSet<String> = request.groups.into_iter().collect();
    Ok(CreatedToken::new(
        secret,
        token_info(&record, groups.into_iter().collect(), now_ms()),
    ))
}

pub async fn list_tokens(store: &Store) -> Result<Vec<TokenInfo>> {
    let tokens = store.list_tokens().await?;
    let inputs = store.load_policy_inputs().await?;
    let now = now_ms();
    Ok(tokens
        .iter()
        .map(|t| token_info(t, inputs.groups_of(&t.id).into_iter().collect(), now))
        .collect())
}

pub async fn revoke_token(store: &Store, id: &str) -> Result<TokenInfo> {
    if !store.revoke_token(id).await? {
        return match store.get_token(id).await? {
            Some(_) => Err(AdminError::Conflict(format!(
                "token '{id}' is already revoked"
            ))),
            None => Err(AdminError::NotFound(format!("no token with id '{id}'"))),
        };
    }
    let token = store
        .get_token(id)
        .await?
        .ok_or_else(|| AdminError::NotFound(format!("no token with id '{id}'")))?;
    let groups = store.token_groups(id).await?;
    Ok(token_info(&token, groups, now_ms()))
}
