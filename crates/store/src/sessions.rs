//! Console sessions: what the sign-in cookie stands for. The cookie holds a
//! random 256-bit id, never the admin token; the store keeps the id's
//! SHA-256, the token it signed in with, and its idle and absolute ends.
//! Every use re-reads the token, so a revoked or expired token ends its
//! sessions on every replica at once.

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use sha2::{Digest, Sha256};

use crate::{Action, Result, Store, TokenRecord, random_bytes};

/// A session's last use is written at most this often (ms), so browsing the
/// console does not write on every page.
const TOUCH_EVERY_MS: i64 = 60_000;

fn id_hash(id: &str) -> String {
    hex::encode(Sha256::digest(id.as_bytes()))
}

impl Store {
    /// Starts a session for `token_id` that ends at `now + absolute_ms`.
    /// Returns the id to put in the cookie (not stored).
    pub async fn create_console_session(
        &self,
        token_id: &str,
        now: i64,
        absolute_ms: i64,
    ) -> Result<String> {
        let id = URL_SAFE_NO_PAD.encode(random_bytes::<32>());
        self.query(
            "INSERT INTO console_sessions (id_hash, token_id, created_at, last_seen_at, expires_at) \
             VALUES ($1, $2, $3, $3, $4)",
        )
        .bind(id_hash(&id))
        .bind(token_id)
        .bind(now)
        .bind(now.saturating_add(absolute_ms))
        .execute(self.pool())
        .await?;
        Ok(id)
    }

    /// The token behind a live session: not past its absolute end, used
    /// within `idle_ms`, and its token still valid with the admin action.
    /// Anything else is `None` (and an ended session is deleted).
    pub async fn console_session(
        &self,
        id: &str,
        now: i64,
        idle_ms: i64,
    ) -> Result<Option<TokenRecord>> {
        let hash = id_hash(id);
        let row = self
            .query(
                "SELECT token_id, last_seen_at, expires_at FROM console_sessions WHERE id_hash = $1",
            )
            .bind(&hash)
            .fetch_optional(self.pool())
            .await?;
        let Some(row) = row else { return Ok(None) };
        use sqlx::Row;
        let token_id: String = row.try_get("token_id")?;
        let last_seen: i64 = row.try_get("last_seen_at")?;
        let expires_at: i64 = row.try_get("expires_at")?;
        let token = self.get_token(&token_id).await?;
        let live = now < expires_at
            && now.saturating_sub(last_seen) < idle_ms
            && token
                .as_ref()
                .is_some_and(|t| !t.is_revoked() && !t.is_expired(now) && t.allows(Action::Admin));
        if !live {
            self.end_console_session(id).await?;
            return Ok(None);
        }
        if now - last_seen >= TOUCH_EVERY_MS {
            self.query("UPDATE console_sessions SET last_seen_at = $1 WHERE id_hash = $2")
                .bind(now)
                .bind(&hash)
                .execute(self.pool())
                .await?;
        }
        Ok(token)
    }

    /// Signs a session out. Unknown ids are fine.
    pub async fn end_console_session(&self, id: &str) -> Result<()> {
        self.query("DELETE FROM console_sessions WHERE id_hash = $1")
            .bind(id_hash(id))
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Ends every session of a token (on revocation). Returns how many.
    pub async fn end_console_sessions_of(&self, token_id: &str) -> Result<u64> {
        let done = self
            .query("DELETE FROM console_sessions WHERE token_id = $1")
            .bind(token_id)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected())
    }

    /// Deletes sessions past their absolute end (the sweep).
    pub async fn sweep_console_sessions(&self, now: i64) -> Result<u64> {
        let done = self
            .query("DELETE FROM console_sessions WHERE expires_at <= $1")
            .bind(now)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected())
    }
}
