//! Named gateway tokens: `mfd_<id>_<secret>`.
//!
//! The id is 12 lowercase hex digits (48 random bits) and is the row's key; the
//! secret is 32 random bytes in unpadded URL-safe base64. Only the SHA-256 of
//! the secret is stored, so the full token is shown once, at creation.
//! Expired tokens are removed by [`Store::sweep_expired_tokens`] in bounded
//! batches; audit rows that name a removed token keep its id in their details.

use std::{collections::BTreeSet, fmt, str::FromStr, time::Duration};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::{Row, any::AnyRow};
use subtle::ConstantTimeEq;

use crate::{Result, Store, StoreError, json_strings, now_ms, random_bytes};

/// Every gateway token starts with this.
pub const TOKEN_PREFIX: &str = "mfd_";
/// How long a token lives unless told otherwise.
pub const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(90 * 24 * 60 * 60);
/// The most tokens one sweep pass deletes.
pub const SWEEP_BATCH: usize = 500;

const ID_BYTES: usize = 6;
const ID_LEN: usize = ID_BYTES * 2;
const SECRET_BYTES: usize = 32;
/// Unpadded base64 of 32 bytes.
const SECRET_LEN: usize = 43;

/// What a token may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// List and search tools.
    Discover,
    /// Call tools.
    Call,
    /// Run code mode.
    Code,
    /// Use the admin API.
    Admin,
}

impl Action {
    pub const ALL: [Action; 4] = [Action::Discover, Action::Call, Action::Code, Action::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Discover => "discover",
            Action::Call => "call",
            Action::Code => "code",
            Action::Admin => "admin",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Action {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Action> {
        Action::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| {
                StoreError::invalid(
                    "action",
                    format!("'{s}' (expected discover, call, code or admin)"),
                )
            })
    }
}

/// When a new token expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Expiry {
    /// [`DEFAULT_TOKEN_LIFETIME`] after creation.
    #[default]
    Default,
    /// This long after creation.
    After(Duration),
    /// At this instant (unix ms); must be after creation.
    At(i64),
    /// Never. Only when asked for explicitly.
    Never,
}

/// A token to create.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub name: String,
    pub actions: BTreeSet<Action>,
    /// Globs over qualified tool names (`server__tool`), e.g. `github__*`, `*`.
    pub scopes: Vec<String>,
    pub expiry: Expiry,
}

impl NewToken {
    /// A token with the default expiry.
    pub fn new<S: Into<String>>(
        name: impl Into<String>,
        actions: impl IntoIterator<Item = Action>,
        scopes: impl IntoIterator<Item = S>,
    ) -> NewToken {
        NewToken {
            name: name.into(),
            actions: actions.into_iter().collect(),
            scopes: scopes.into_iter().map(Into::into).collect(),
            expiry: Expiry::Default,
        }
    }

    pub fn expiry(mut self, expiry: Expiry) -> NewToken {
        self.expiry = expiry;
        self
    }

    fn validate(&self) -> Result<()> {
        let name = self.name.trim();
        if name.is_empty() || name.len() > 200 {
            return Err(StoreError::invalid(
                "token name",
                "must be 1 to 200 characters",
            ));
        }
        if self.actions.is_empty() {
            return Err(StoreError::invalid(
                "token actions",
                "at least one of discover, call, code, admin",
            ));
        }
        for scope in &self.scopes {
            if scope.is_empty() || scope.chars().any(char::is_whitespace) {
                return Err(StoreError::invalid(
                    "token scope",
                    format!("{scope:?} (a non-empty glob without spaces)"),
                ));
            }
        }
        Ok(())
    }
}

/// Whether a token scope matches a qualified name (`server__tool`).
///
/// A scope `SERVER__TOOL` is matched on the pair: its server glob against the
/// server and its tool glob against the tool, both split at their first `__`.
/// The split of a qualified name is the real pair because server names never
/// contain `__` nor start or end with `_` (`UpstreamConfig::validate`).
/// Matched on the joined string, `a__*` also reached server `a_`'s tool `x`
/// (`a___x`). A scope without `__` (`*`, `git*`) keeps its glob over the whole
/// name, so stored scopes keep their meaning (tests/store/tokens.rs).
pub fn scope_matches(scope: &str, qualified: &str) -> bool {
    match (scope.split_once("__"), qualified.split_once("__")) {
        (Some((server_glob, tool_glob)), Some((server, tool))) => {
            crate::glob_match(server_glob, server) && crate::glob_match(tool_glob, tool)
        }
        (Some(_), None) => false,
        (None, _) => crate::glob_match(scope, qualified),
    }
}

/// A stored token, without its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenRecord {
    pub id: String,
    pub name: String,
    pub created_at: i64,
    /// `None`: never expires.
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
    pub actions: BTreeSet<Action>,
    pub scopes: Vec<String>,
}

impl TokenRecord {
    pub fn allows(&self, action: Action) -> bool {
        self.actions.contains(&action)
    }

    /// Whether any scope matches the tool with this qualified name.
    pub fn scope_allows(&self, qualified_tool: &str) -> bool {
        self.scopes
            .iter()
            .any(|scope| scope_matches(scope, qualified_tool))
    }

    pub fn is_expired(&self, now: i64) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }

    pub fn is_revoked(&self) -> bool {
        self.revoked_at.is_some()
    }

    fn from_row(row: &AnyRow) -> Result<TokenRecord> {
        let actions_text: String = row.try_get("actions")?;
        let actions = json_strings("token actions", &actions_text)?
            .iter()
            .map(|a| a.parse())
            .collect::<Result<BTreeSet<Action>>>()
            .map_err(|_| StoreError::corrupt("token actions", actions_text.clone()))?;
        let scopes_text: String = row.try_get("scopes")?;
        Ok(TokenRecord {
            id: row.try_get("id")?,
            name: row.try_get("name")?,
            created_at: row.try_get("created_at")?,
            expires_at: row.try_get("expires_at")?,
            revoked_at: row.try_get("revoked_at")?,
            actions,
            scopes: json_strings("token scopes", &scopes_text)?,
        })
    }
}

/// Why a bearer token was refused.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("malformed token")]
    Malformed,
    #[error("unknown token")]
    Unknown,
    #[error("token expired")]
    Expired,
    #[error("token revoked")]
    Revoked,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl AuthError {
    /// A short reason for the access audit.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::Malformed => "malformed",
            AuthError::Unknown => "unknown",
            AuthError::Expired => "expired",
            AuthError::Revoked => "revoked",
            AuthError::Store(_) => "store_error",
        }
    }
}

/// Splits `mfd_<id>_<secret>` into id and secret, checking their shape.
fn parse_bearer(bearer: &str) -> Option<(&str, &str)> {
    let (id, secret) = bearer.strip_prefix(TOKEN_PREFIX)?.split_once('_')?;
    let id_ok = id.len() == ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let secret_ok = secret.len() == SECRET_LEN
        && secret
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    (id_ok && secret_ok).then_some((id, secret))
}

/// The token id a bearer claims, if it is well-formed (for the access audit
/// of a failed attempt). Says nothing about whether the token exists.
pub fn token_id_of(bearer: &str) -> Option<&str> {
    parse_bearer(bearer).map(|(id, _)| id)
}

fn secret_hash(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

const TOKEN_COLUMNS: &str = "id, name, created_at, expires_at, revoked_at, actions, scopes";

impl Store {
    /// Creates a token. Returns the record and the full bearer token
    /// (`mfd_<id>_<secret>`), which is not stored and cannot be shown again.
    pub async fn create_token(&self, new: NewToken) -> Result<(TokenRecord, String)> {
        self.create_token_at(new, now_ms()).await
    }

    /// [`Store::create_token`] with an explicit creation time.
    pub async fn create_token_at(&self, new: NewToken, now: i64) -> Result<(TokenRecord, String)> {
        new.validate()?;
        let expires_at = match new.expiry {
            Expiry::Default => Some(now.saturating_add(duration_ms(DEFAULT_TOKEN_LIFETIME))),
            Expiry::After(d) => Some(now.saturating_add(duration_ms(d))),
            Expiry::At(at) if at > now => Some(at),
            Expiry::At(_) => {
                return Err(StoreError::invalid(
                    "token expiry",
                    "must be after the creation time",
                ));
            }
            Expiry::Never => None,
        };
        let actions: Vec<&str> = new.actions.iter().map(|a| a.as_str()).collect();
        let actions_json = serde_json::to_string(&actions).expect("strings serialize");
        let scopes_json = serde_json::to_string(&new.scopes).expect("strings serialize");

        // 48-bit ids: a collision is unlikely but must not fail the call.
        for _ in 0..4 {
            let id = hex::encode(random_bytes::<ID_BYTES>());
            let secret = URL_SAFE_NO_PAD.encode(random_bytes::<SECRET_BYTES>());
            let inserted = self
                .query(
                    "INSERT INTO tokens (id, name, secret_hash, actions, scopes, created_at, expires_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7)",
                )
                .bind(&id)
                .bind(new.name.trim())
                .bind(hex::encode(secret_hash(&secret)))
                .bind(&actions_json)
                .bind(&scopes_json)
                .bind(now)
                .bind(expires_at)
                .execute(self.pool())
                .await;
            self.governance_written();
            match inserted {
                Ok(_) => {
                    let record = TokenRecord {
                        id: id.clone(),
                        name: new.name.trim().to_string(),
                        created_at: now,
                        expires_at,
                        revoked_at: None,
                        actions: new.actions.clone(),
                        scopes: new.scopes.clone(),
                    };
                    return Ok((record, format!("{TOKEN_PREFIX}{id}_{secret}")));
                }
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(StoreError::Conflict(
            "could not find a free token id".to_string(),
        ))
    }

    /// Checks a bearer token at `now`. The secret is compared in constant
    /// time; a wrong secret for an existing id is reported as
    /// [`AuthError::Unknown`], like an id that does not exist.
    pub async fn authenticate(&self, bearer: &str, now: i64) -> Result<TokenRecord, AuthError> {
        let (id, secret) = parse_bearer(bearer).ok_or(AuthError::Malformed)?;
        let presented = secret_hash(secret);
        let row = self
            .query(
                "SELECT id, name, created_at, expires_at, revoked_at, actions, scopes, secret_hash \
                 FROM tokens WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .map_err(StoreError::from)?;
        let Some(row) = row else {
            // Same work as a known id, so timing says little about existence.
            let _ = presented.ct_eq(&[0u8; 32]);
            return Err(AuthError::Unknown);
        };
        let stored_hex: String = row.try_get("secret_hash").map_err(StoreError::from)?;
        let mut stored = [0u8; 32];
        hex::decode_to_slice(&stored_hex, &mut stored)
            .map_err(|_| StoreError::corrupt("token secret hash", stored_hex.clone()))?;
        if !bool::from(presented.ct_eq(&stored)) {
            return Err(AuthError::Unknown);
        }
        let record = TokenRecord::from_row(&row)?;
        if record.is_revoked() {
            return Err(AuthError::Revoked);
        }
        if record.is_expired(now) {
            return Err(AuthError::Expired);
        }
        Ok(record)
    }

    pub async fn get_token(&self, id: &str) -> Result<Option<TokenRecord>> {
        let sql = format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE id = $1");
        let row = self
            .query(&sql)
            .bind(id)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(TokenRecord::from_row).transpose()
    }

    /// All tokens, oldest first.
    pub async fn list_tokens(&self) -> Result<Vec<TokenRecord>> {
        let sql = format!("SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY created_at, id");
        let rows = self.query(&sql).fetch_all(self.pool()).await?;
        rows.iter().map(TokenRecord::from_row).collect()
    }

    /// Revokes a token now. `false` if it does not exist or was already revoked.
    pub async fn revoke_token(&self, id: &str) -> Result<bool> {
        let done = self
            .query("UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
            .bind(now_ms())
            .bind(id)
            .execute(self.pool())
            .await?;
        self.governance_written();
        // Its console sessions end with it (each use re-checks the token too).
        self.end_console_sessions_of(id).await?;
        Ok(done.rows_affected() > 0)
    }

    /// Deletes a token outright. Audit rows keep its id in their details.
    pub async fn delete_token(&self, id: &str) -> Result<bool> {
        let done = self
            .query("DELETE FROM tokens WHERE id = $1")
            .bind(id)
            .execute(self.pool())
            .await?;
        self.governance_written();
        Ok(done.rows_affected() > 0)
    }

    /// One cleanup pass: deletes at most [`SWEEP_BATCH`] tokens that expired
    /// at or before `now`, oldest expiry first (an index range scan on
    /// `expires_at`). Tokens without expiry are never touched. Returns how
    /// many were deleted.
    pub async fn sweep_expired_tokens(&self, now: i64) -> Result<usize> {
        let done = self
            .query(
                "DELETE FROM tokens WHERE id IN (\
                   SELECT id FROM tokens \
                   WHERE expires_at IS NOT NULL AND expires_at <= $1 \
                   ORDER BY expires_at LIMIT $2)",
            )
            .bind(now)
            .bind(SWEEP_BATCH as i64)
            .execute(self.pool())
            .await?;
        if done.rows_affected() > 0 {
            self.governance_written();
        }
        Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
    }

    /// Sweeps until a pass deletes fewer than [`SWEEP_BATCH`] tokens. Returns
    /// each pass's count (passes that deleted nothing are left out). Each
    /// pass is its own short statement, so no lock is held across passes.
    pub async fn sweep_all_expired(&self, now: i64) -> Result<Vec<usize>> {
        let mut passes = Vec::new();
        loop {
            let deleted = self.sweep_expired_tokens(now).await?;
            if deleted > 0 {
                passes.push(deleted);
            }
            if deleted < SWEEP_BATCH {
                return Ok(passes);
            }
        }
    }

    /// Puts a token in a group (policies can select groups). Idempotent.
    pub async fn add_token_group(&self, token_id: &str, group: &str) -> Result<()> {
        validate_group(group)?;
        let done = self
            .query(
                "INSERT INTO token_groups (token_id, group_name) \
                 SELECT id, $2 FROM tokens WHERE id = $1 \
                 ON CONFLICT (token_id, group_name) DO NOTHING",
            )
            .bind(token_id)
            .bind(group)
            .execute(self.pool())
            .await?;
        self.governance_written();
        if done.rows_affected() == 0 && self.get_token(token_id).await?.is_none() {
            return Err(StoreError::NotFound {
                what: "token",
                id: token_id.to_string(),
            });
        }
        Ok(())
    }

    pub async fn remove_token_group(&self, token_id: &str, group: &str) -> Result<bool> {
        let done = self
            .query("DELETE FROM token_groups WHERE token_id = $1 AND group_name = $2")
            .bind(token_id)
            .bind(group)
            .execute(self.pool())
            .await?;
        self.governance_written();
        Ok(done.rows_affected() > 0)
    }

    /// The groups a token is in, sorted.
    pub async fn token_groups(&self, token_id: &str) -> Result<Vec<String>> {
        let rows = self
            .query("SELECT group_name FROM token_groups WHERE token_id = $1 ORDER BY group_name")
            .bind(token_id)
            .fetch_all(self.pool())
            .await?;
        rows.iter()
            .map(|r| r.try_get("group_name").map_err(StoreError::from))
            .collect()
    }
}

pub(crate) fn validate_group(group: &str) -> Result<()> {
    if group.is_empty() || group.len() > 200 || group.chars().any(char::is_whitespace) {
        return Err(StoreError::invalid(
            "group name",
            format!("{group:?} (1 to 200 characters, no spaces)"),
        ));
    }
    Ok(())
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_well_formed_tokens_only() {
        let secret = URL_SAFE_NO_PAD.encode([7u8; 32]);
        let token = format!("mfd_0123456789ab_{secret}");
        assert_eq!(
            parse_bearer(&token),
            Some(("0123456789ab", secret.as_str()))
        );
        assert_eq!(token_id_of(&token), Some("0123456789ab"));
        // Secrets may contain '_' themselves: only the first one splits.
        let underscored = format!("mfd_0123456789ab_{}", "_".repeat(43));
        assert!(parse_bearer(&underscored).is_some());
        for bad in [
            String::new(),
            "mfd_".to_string(),
            "Bearer mfd_0123456789ab_x".to_string(),
            format!("mfx_0123456789ab_{secret}"),
            format!("mfd_0123456789AB_{secret}"),
            format!("mfd_0123456789a_{secret}"),
            format!("mfd_0123456789ab_{secret}="),
            format!("mfd_0123456789ab_{}", &secret[1..]),
            format!("mfd_0123456789ab{secret}"),
        ] {
            assert_eq!(parse_bearer(&bad), None, "{bad}");
        }
    }

    #[test]
    fn actions_round_trip() {
        for a in Action::ALL {
            assert_eq!(a.as_str().parse::<Action>().unwrap(), a);
        }
        assert!("root".parse::<Action>().is_err());
    }
}
