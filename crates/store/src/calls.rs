//! One caller's latest call to one tool, as the console's playground shows
//! it under the call's result.

use serde_json::Value;

use crate::{AuditKind, Result, Store, audit::audit_json};

impl Store {
    /// The newest activity row of `principal` calling `tool` at or after
    /// `since` (unix ms), as [`Store::audit_tail`] renders rows.
    pub async fn latest_call(
        &self,
        principal: &str,
        tool: &str,
        since: i64,
    ) -> Result<Option<Value>> {
        self.settle_audit().await;
        let sql = format!(
            "{} WHERE created_at >= $1 AND principal = $2 AND tool = $3 ORDER BY id DESC LIMIT 1",
            AuditKind::Activity.select()
        );
        let row = self
            .query(&sql)
            .bind(since)
            .bind(principal)
            .bind(tool)
            .fetch_optional(self.pool())
            .await?;
        row.map(|row| audit_json(AuditKind::Activity, &row))
            .transpose()
    }
}
