//! The audit trails, merged by time.

use manifold_store::{AuditKind, Store};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::Result;

pub fn audit_kinds(kind: Option<&str>) -> Result<Vec<AuditKind>> {
    match kind.map(str::trim).filter(|k| !k.is_empty() && *k != "all") {
        None => Ok(AuditKind::ALL.to_vec()),
        Some(k) => Ok(vec![k.parse::<AuditKind>()?]),
    }
}

/// By time; ties by trail then row id, so output is stable. A row still
/// in a running gateway's journal (no id yet) comes after its trail's
/// committed rows of the same time.
fn sort_rows(rows: &mut [Value]) {
    rows.sort_by_key(|r| {
        (
            r["created_at"].as_i64().unwrap_or(0),
            r["kind"].as_str().unwrap_or("").to_string(),
            r["id"].as_i64().unwrap_or(i64::MAX),
        )
    });
}

/// The last `n` rows of the trails, merged by time, oldest first.
pub async fn audit_tail(store: &Store, kinds: &[AuditKind], n: usize) -> Result<Vec<Value>> {
    let mut rows = Vec::new();
    for &kind in kinds {
        rows.extend(store.audit_tail(kind, n).await?);
    }
    sort_rows(&mut rows);
    // Each trail gave its last n; the merged tail is the last n of those.
    let skip = rows.len().saturating_sub(n);
    Ok(rows.split_off(skip))
}

/// Every row since `since` (unix ms), merged by time, oldest first.
pub async fn audit_export(store: &Store, kinds: &[AuditKind], since: i64) -> Result<Vec<Value>> {
    let mut rows = Vec::new();
    for &kind in kinds {
        rows.extend(store.audit_export(kind, since).await?);
    }
    sort_rows(&mut rows);
    Ok(rows)
}

/// One audit row, as the store exports it (the schema of `/admin/audit`'s
/// rows and of each export line). Which fields appear depends on `kind`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AuditRow {
    /// `discovery`, `access` or `activity`.
    pub kind: String,
    /// None for a row still in a running gateway's journal, committed a
    /// moment later.
    pub id: Option<i64>,
    pub created_at: i64,
    pub principal: Option<String>,
    pub token_id: Option<String>,
    /// Discovery: how many tools the caller was shown, and their digest.
    pub visible_count: Option<i64>,
    pub visible_digest: Option<String>,
    /// Access: `success` or `failure`; activity: `success`, `error` or `not_forwarded`.
    pub outcome: Option<String>,
    /// Access: why it failed.
    pub reason: Option<String>,
    /// Activity: the qualified tool, the arguments' hash, the decision.
    pub tool: Option<String>,
    pub args_hash: Option<String>,
    /// `allowed`, `denied`, `approval_required`, `approved` or `rate_limited`.
    pub decision: Option<String>,
    pub approval_id: Option<String>,
    pub latency_ms: Option<i64>,
    pub bytes_in: Option<i64>,
    pub bytes_out: Option<i64>,
    #[schema(value_type = Object)]
    pub details: Value,
}
