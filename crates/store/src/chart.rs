//! The console's per-server chart: calls, errors, refusals and median latency
//! over the last hour in one-minute buckets, from the activity audit.
//!
//! One statement computes it, so every replica on one database draws the same
//! chart. It is bounded twice: by the hour (the `created_at` index) and by
//! [`CHART_MAX_ROWS`], the newest rows of the server read at most. The median
//! is computed in SQL with `ROW_NUMBER()` and `COUNT(*)` windows, which
//! SQLite (3.25+) and PostgreSQL both have; neither has a portable
//! `percentile_cont`.

use sqlx::Row;

use crate::{Result, Store};

/// Buckets in a chart, and how long each is.
pub const CHART_BUCKETS: usize = 60;
pub const CHART_BUCKET_MS: i64 = 60_000;
/// The most rows one chart reads; past it the oldest minutes are undercounted
/// and [`CallChart::truncated`] says so.
pub const CHART_MAX_ROWS: i64 = 100_000;

/// One minute of one server's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallBucket {
    /// Unix milliseconds at the bucket's start.
    pub start: i64,
    /// Every activity row: forwarded or refused.
    pub calls: u64,
    /// Forwarded calls that failed upstream or returned `isError`.
    pub errors: u64,
    /// Calls governance refused (denied, rate limited, invalid arguments, ...).
    pub refused: u64,
    /// The median latency of the forwarded calls (the lower middle one when
    /// their number is even); `None` when nothing was forwarded.
    pub p50_ms: Option<i64>,
}

/// The last hour, oldest minute first, every minute present (empty ones too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallChart {
    pub buckets: Vec<CallBucket>,
    /// The hour held more than [`CHART_MAX_ROWS`] rows for this server.
    pub truncated: bool,
}

const CHART_SQL: &str = "\
WITH recent AS (
  SELECT created_at, outcome, latency_ms FROM activity_audit
  WHERE created_at >= $1 AND created_at < $2 AND substr(tool, 1, CAST($3 AS INTEGER)) = $4
  ORDER BY created_at DESC LIMIT $5
),
bucketed AS (
  SELECT (created_at - $1) / $6 AS bucket, outcome, latency_ms FROM recent
),
ranked AS (
  SELECT bucket, latency_ms,
         ROW_NUMBER() OVER (PARTITION BY bucket ORDER BY latency_ms) AS position,
         COUNT(*) OVER (PARTITION BY bucket) AS forwarded
  FROM bucketed WHERE outcome <> 'not_forwarded'
)
SELECT b.bucket AS bucket,
       COUNT(*) AS calls,
       SUM(CASE WHEN b.outcome = 'error' THEN 1 ELSE 0 END) AS errors,
       SUM(CASE WHEN b.outcome = 'not_forwarded' THEN 1 ELSE 0 END) AS refused,
       (SELECT r.latency_ms FROM ranked r
         WHERE r.bucket = b.bucket AND r.position = (r.forwarded + 1) / 2) AS p50
FROM bucketed b
GROUP BY b.bucket
ORDER BY b.bucket";

impl Store {
    /// The chart of the hour before `now` for the tools whose qualified name
    /// starts with `tool_prefix` (`"server__"`; `""` for every tool).
    /// Buckets are aligned to whole minutes; the last is the current one.
    pub async fn call_chart(&self, tool_prefix: &str, now: i64) -> Result<CallChart> {
        self.settle_audit().await;
        let end = (now.div_euclid(CHART_BUCKET_MS) + 1) * CHART_BUCKET_MS;
        let since = end - CHART_BUCKETS as i64 * CHART_BUCKET_MS;
        let prefix_chars = tool_prefix.chars().count() as i64;
        let rows = self
            .query(CHART_SQL)
            .bind(since)
            .bind(end)
            .bind(prefix_chars)
            .bind(tool_prefix)
            .bind(CHART_MAX_ROWS)
            .bind(CHART_BUCKET_MS)
            .fetch_all(self.pool())
            .await?;
        let mut buckets: Vec<CallBucket> = (0..CHART_BUCKETS as i64)
            .map(|i| CallBucket {
                start: since + i * CHART_BUCKET_MS,
                ..CallBucket::default()
            })
            .collect();
        let mut read = 0i64;
        for row in rows {
            let index: i64 = row.try_get("bucket")?;
            let calls: i64 = row.try_get("calls")?;
            read += calls;
            let Some(bucket) = usize::try_from(index).ok().and_then(|i| buckets.get_mut(i)) else {
                continue;
            };
            bucket.calls = calls.max(0) as u64;
            bucket.errors = row.try_get::<i64, _>("errors")?.max(0) as u64;
            bucket.refused = row.try_get::<i64, _>("refused")?.max(0) as u64;
            bucket.p50_ms = row.try_get("p50")?;
        }
        Ok(CallChart {
            buckets,
            truncated: read >= CHART_MAX_ROWS,
        })
    }
}
