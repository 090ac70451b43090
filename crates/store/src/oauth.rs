//! What the gateway keeps as an OAuth client of its upstreams: tokens,
//! client registrations and sign-ins under way, sealed with the gateway's
//! secret key, so every replica can use them and none of them is in clear
//! in the database.
//!
//! The store only seals and keeps bytes; what they mean (rmcp's stored
//! credentials, a PKCE verifier) is the upstream crate's business.

use aws_lc_rs::{
    aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey},
    hkdf,
};
use base64::{Engine, engine::general_purpose::STANDARD};
use sqlx::Row;

use crate::{Result, Store, StoreError};

/// The shortest secret accepted as `MANIFOLD_SECRET_KEY` or in the key file.
pub const MIN_SECRET_LEN: usize = 32;
const SEALED_PREFIX: &str = "v1:";

/// Seals and opens secrets with AES-256-GCM under a key derived (HKDF-SHA256)
/// from the gateway's secret. Each sealed value is bound to where it is
/// kept (its table and key), so a value copied to another row does not open.
pub struct Sealer {
    key: LessSafeKey,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer")
    }
}

impl Sealer {
    /// A sealer for `secret` (at least [`MIN_SECRET_LEN`] bytes, e.g. 32
    /// random bytes in base64).
    pub fn new(secret: &[u8]) -> Result<Sealer> {
        let secret = secret.trim_ascii();
        if secret.len() < MIN_SECRET_LEN {
            return Err(StoreError::invalid(
                "secret key",
                format!(
                    "at least {MIN_SECRET_LEN} characters are needed (e.g. `openssl rand -base64 32`)"
                ),
            ));
        }
        let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, b"manifold secret key v1");
        let mut bytes = [0u8; 32];
        salt.extract(secret)
            .expand(&[b"oauth sealing"], &AES_256_GCM)
            .and_then(|okm| okm.fill(&mut bytes))
            .map_err(|_| StoreError::invalid("secret key", "key derivation failed"))?;
        let key = UnboundKey::new(&AES_256_GCM, &bytes)
            .map_err(|_| StoreError::invalid("secret key", "unusable key"))?;
        Ok(Sealer {
            key: LessSafeKey::new(key),
        })
    }

    /// A fresh random secret, base64, for a key file.
    pub fn generate_secret() -> String {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).expect("the OS random source works");
        STANDARD.encode(bytes)
    }

    pub fn seal(&self, place: &str, plain: &[u8]) -> Result<String> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).expect("the OS random source works");
        let mut data = plain.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(place.as_bytes()),
                &mut data,
            )
            .map_err(|_| StoreError::invalid("secret", "sealing failed"))?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&data);
        Ok(format!("{SEALED_PREFIX}{}", STANDARD.encode(out)))
    }

    pub fn open(&self, place: &str, sealed: &str) -> Result<Vec<u8>> {
        let unreadable = || {
            StoreError::corrupt(
                "sealed secret (another secret key, or a value moved between rows)",
                place,
            )
        };
        let raw = sealed
            .strip_prefix(SEALED_PREFIX)
            .and_then(|b64| STANDARD.decode(b64).ok())
            .filter(|raw| raw.len() > NONCE_LEN)
            .ok_or_else(unreadable)?;
        let (nonce, data) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| unreadable())?;
        let mut data = data.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(place.as_bytes()), &mut data)
            .map_err(|_| unreadable())?;
        Ok(plain.to_vec())
    }
}

/// One server's (or one principal's) stored tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedCredentials {
    pub plain: Vec<u8>,
    pub version: i64,
    pub updated_at: i64,
}

/// How long a sign-in under way is kept for its callback.
pub const PENDING_MAX_AGE_MS: i64 = 900_000;

/// A sign-in under way, as its sign-in page and callback see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingSignIn {
    pub server: String,
    /// `""`: the server's shared credentials.
    pub principal: String,
    /// Where the sign-in page sends the browser, once linked.
    pub authorize_url: Option<String>,
    /// The SHA-256 (hex) of the cookie the callback must bring, once bound.
    pub binding: Option<String>,
}

fn credentials_place(server: &str, principal: &str) -> String {
    format!("oauth_credentials\0{server}\0{principal}")
}

impl Store {
    /// The tokens kept for `server` and `principal` (`""`: the server's
    /// shared ones), opened with `sealer`.
    pub async fn oauth_credentials(
        &self,
        sealer: &Sealer,
        server: &str,
        principal: &str,
    ) -> Result<Option<SealedCredentials>> {
        let row = self
            .query(
                "SELECT sealed, version, updated_at FROM oauth_credentials \
                 WHERE server = $1 AND principal = $2",
            )
            .bind(server)
            .bind(principal)
            .fetch_optional(self.pool())
            .await?;
        row.map(|row| {
            let sealed: String = row.try_get("sealed")?;
            Ok(SealedCredentials {
                plain: sealer.open(&credentials_place(server, principal), &sealed)?,
                version: row.try_get("version")?,
                updated_at: row.try_get("updated_at")?,
            })
        })
        .transpose()
    }

    /// Saves tokens for `server` and `principal`; returns the new version.
    pub async fn save_oauth_credentials(
        &self,
        sealer: &Sealer,
        server: &str,
        principal: &str,
        plain: &[u8],
        now: i64,
    ) -> Result<i64> {
        let sealed = sealer.seal(&credentials_place(server, principal), plain)?;
        let row = self
            .query(
                "INSERT INTO oauth_credentials (server, principal, sealed, version, updated_at) \
                 VALUES ($1, $2, $3, 1, $4) \
                 ON CONFLICT (server, principal) DO UPDATE SET sealed = excluded.sealed, \
                 version = oauth_credentials.version + 1, updated_at = excluded.updated_at \
                 RETURNING version",
            )
            .bind(server)
            .bind(principal)
            .bind(sealed)
            .bind(now)
            .fetch_one(self.pool())
            .await?;
        Ok(row.try_get("version")?)
    }

    /// Forgets the tokens of `server` and `principal` (a sign-out, or a
    /// refresh token the provider refused).
    pub async fn clear_oauth_credentials(&self, server: &str, principal: &str) -> Result<bool> {
        let done = self
            .query("DELETE FROM oauth_credentials WHERE server = $1 AND principal = $2")
            .bind(server)
            .bind(principal)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Takes the refresh lease of `server`/`principal` for `owner` until
    /// `until` if nobody holds it (or its holder's lease ran out). Only one
    /// replica refreshes at a time, without holding a database lock across
    /// the provider's answer. A row is created if there is none yet.
    pub async fn take_oauth_lease(
        &self,
        server: &str,
        principal: &str,
        owner: &str,
        now: i64,
        until: i64,
    ) -> Result<bool> {
        let taken = self
            .query(
                "UPDATE oauth_credentials SET lease_owner = $3, lease_until = $5 \
                 WHERE server = $1 AND principal = $2 AND (lease_until <= $4 OR lease_owner = $3)",
            )
            .bind(server)
            .bind(principal)
            .bind(owner)
            .bind(now)
            .bind(until)
            .execute(self.pool())
            .await?;
        Ok(taken.rows_affected() == 1)
    }

    /// Gives the lease back, if `owner` still holds it.
    pub async fn release_oauth_lease(
        &self,
        server: &str,
        principal: &str,
        owner: &str,
    ) -> Result<()> {
        self.query(
            "UPDATE oauth_credentials SET lease_owner = NULL, lease_until = 0 \
             WHERE server = $1 AND principal = $2 AND lease_owner = $3",
        )
        .bind(server)
        .bind(principal)
        .bind(owner)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// The client registration kept for `server`, opened.
    pub async fn oauth_client(&self, sealer: &Sealer, server: &str) -> Result<Option<Vec<u8>>> {
        let row = self
            .query("SELECT sealed FROM oauth_clients WHERE server = $1")
            .bind(server)
            .fetch_optional(self.pool())
            .await?;
        row.map(|row| {
            let sealed: String = row.try_get("sealed")?;
            sealer.open(&format!("oauth_clients\0{server}"), &sealed)
        })
        .transpose()
    }

    pub async fn save_oauth_client(
        &self,
        sealer: &Sealer,
        server: &str,
        plain: &[u8],
        now: i64,
    ) -> Result<()> {
        let sealed = sealer.seal(&format!("oauth_clients\0{server}"), plain)?;
        self.query(
            "INSERT INTO oauth_clients (server, sealed, updated_at) VALUES ($1, $2, $3) \
             ON CONFLICT (server) DO UPDATE SET sealed = excluded.sealed, updated_at = excluded.updated_at",
        )
        .bind(server)
        .bind(sealed)
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Keeps a sign-in under way (its PKCE verifier and CSRF token) under
    /// `state`, for whichever replica gets the callback.
    pub async fn save_oauth_pending(
        &self,
        sealer: &Sealer,
        state: &str,
        server: &str,
        principal: &str,
        plain: &[u8],
        now: i64,
    ) -> Result<()> {
        let sealed = sealer.seal(&format!("oauth_pending\0{state}"), plain)?;
        self.query(
            "INSERT INTO oauth_pending (state, server, principal, sealed, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(state)
        .bind(server)
        .bind(principal)
        .bind(sealed)
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// The sign-in under `state` (server, principal, opened secret), if it
    /// is younger than `max_age_ms`.
    pub async fn oauth_pending(
        &self,
        sealer: &Sealer,
        state: &str,
        now: i64,
        max_age_ms: i64,
    ) -> Result<Option<(String, String, Vec<u8>)>> {
        let row = self
            .query(
                "SELECT server, principal, sealed, created_at FROM oauth_pending WHERE state = $1",
            )
            .bind(state)
            .fetch_optional(self.pool())
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let created_at: i64 = row.try_get("created_at")?;
        if now - created_at > max_age_ms {
            return Ok(None);
        }
        let sealed: String = row.try_get("sealed")?;
        let plain = sealer.open(&format!("oauth_pending\0{state}"), &sealed)?;
        Ok(Some((
            row.try_get("server")?,
            row.try_get("principal")?,
            plain,
        )))
    }

    /// Keeps the authorization server's URL of the sign-in under `state`,
    /// where the gateway's sign-in page sends the browser.
    pub async fn link_oauth_pending(&self, state: &str, authorize_url: &str) -> Result<bool> {
        let done = self
            .query("UPDATE oauth_pending SET authorize_url = $2 WHERE state = $1")
            .bind(state)
            .bind(authorize_url)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Binds the sign-in under `state` to a browser: `binding` is the hash
    /// of the cookie its callback must bring. A later binding (the same
    /// principal in another browser) replaces it.
    pub async fn bind_oauth_pending(&self, state: &str, binding: &str) -> Result<bool> {
        let done = self
            .query("UPDATE oauth_pending SET binding = $2 WHERE state = $1")
            .bind(state)
            .bind(binding)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Who the sign-in under `state` is for and where it is bound, without
    /// its secret, if it is younger than `max_age_ms`.
    pub async fn oauth_pending_sign_in(
        &self,
        state: &str,
        now: i64,
        max_age_ms: i64,
    ) -> Result<Option<PendingSignIn>> {
        let row = self
            .query(
                "SELECT server, principal, authorize_url, binding, created_at \
                 FROM oauth_pending WHERE state = $1",
            )
            .bind(state)
            .fetch_optional(self.pool())
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let created_at: i64 = row.try_get("created_at")?;
        if now - created_at > max_age_ms {
            return Ok(None);
        }
        Ok(Some(PendingSignIn {
            server: row.try_get("server")?,
            principal: row.try_get("principal")?,
            authorize_url: row.try_get("authorize_url")?,
            binding: row.try_get("binding")?,
        }))
    }

    /// Ends the sign-in under `state` (used, or abandoned: sweeps drop
    /// those older than `before`).
    pub async fn delete_oauth_pending(&self, state: &str, before: Option<i64>) -> Result<u64> {
        let done = match before {
            None => {
                self.query("DELETE FROM oauth_pending WHERE state = $1")
                    .bind(state)
                    .execute(self.pool())
                    .await?
            }
            Some(before) => {
                self.query("DELETE FROM oauth_pending WHERE created_at < $1")
                    .bind(before)
                    .execute(self.pool())
                    .await?
            }
        };
        Ok(done.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_with_their_key_and_place() {
        let sealer = Sealer::new(Sealer::generate_secret().as_bytes()).unwrap();
        let sealed = sealer.seal("a\0b", b"refresh-token").unwrap();
        assert!(!sealed.contains("refresh"));
        assert_eq!(sealer.open("a\0b", &sealed).unwrap(), b"refresh-token");
        assert!(sealer.open("a\0c", &sealed).is_err());
        let other = Sealer::new(Sealer::generate_secret().as_bytes()).unwrap();
        assert!(other.open("a\0b", &sealed).is_err());
        assert!(sealer.open("a\0b", "v1:AAAA").is_err());
        // Two seals of one value differ (a fresh nonce each time).
        assert_ne!(sealed, sealer.seal("a\0b", b"refresh-token").unwrap());
        assert!(Sealer::new(b"short").is_err());
    }
}
