//! Rate-limit counters in the store, so every gateway process on one
//! PostgreSQL database counts against the same limits.
//!
//! Fixed windows: a hit at `now` lands in the window starting at
//! `now - now % window`. Each hit is one atomic upsert that returns the new
//! count, so concurrent hits from any number of processes are all counted.

use sqlx::Row;

use crate::{Result, Store, StoreError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateDecision {
    /// Whether this hit is within the limit.
    pub allowed: bool,
    /// Hits in the current window, this one included.
    pub count: u64,
    /// When refused: milliseconds until the window ends. 0 when allowed.
    pub retry_after_ms: u64,
}

impl Store {
    /// Counts one hit on `key` and says whether it is within `limit` hits per
    /// `window_seconds`. Refused hits are counted too.
    pub async fn rate_limit_hit(
        &self,
        key: &str,
        window_seconds: u32,
        limit: u32,
        now: i64,
    ) -> Result<RateDecision> {
        if window_seconds == 0 {
            return Err(StoreError::invalid(
                "rate window",
                "must be at least 1 second",
            ));
        }
        let window_ms = i64::from(window_seconds) * 1000;
        let window_start = now - now.rem_euclid(window_ms);
        let window_end = window_start + window_ms;
        let row = self
            .query(
                "INSERT INTO rate_limit_windows (bucket_key, window_ms, window_start, hits, expires_at) \
                 VALUES ($1, $2, $3, 1, $4) \
                 ON CONFLICT (bucket_key, window_ms, window_start) \
                 DO UPDATE SET hits = rate_limit_windows.hits + 1 \
                 RETURNING hits",
            )
            .bind(key)
            .bind(window_ms)
            .bind(window_start)
            .bind(window_end)
            .fetch_one(self.pool())
            .await?;
        let hits: i64 = row.try_get("hits")?;
        let count = u64::try_from(hits).unwrap_or(0);
        let allowed = count <= u64::from(limit);
        Ok(RateDecision {
            allowed,
            count,
            retry_after_ms: if allowed {
                0
            } else {
                u64::try_from(window_end - now).unwrap_or(0)
            },
        })
    }

    /// Deletes windows that ended at or before `now`. Returns how many.
    pub async fn sweep_rate_limits(&self, now: i64) -> Result<u64> {
        let done = self
            .query("DELETE FROM rate_limit_windows WHERE expires_at <= $1")
            .bind(now)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected())
    }
}
