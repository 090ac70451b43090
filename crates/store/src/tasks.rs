//! Tasks the gateway hands out (the `io.modelcontextprotocol/tasks`
//! extension). The caller sees a random id; the row says which principal
//! made the task, which server runs it and the upstream's own id, so any
//! replica can forward `tasks/*` for it. A task is found only by its owner:
//! to anybody else its id is unknown.

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use sqlx::Row;

use crate::{Result, Store, random_bytes};

/// Where a passed-through task lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRoute {
    pub id: String,
    pub server: String,
    /// The qualified tool whose call made the task.
    pub tool: String,
    pub upstream_id: String,
    pub expires_at: i64,
}

impl Store {
    /// Records a task `server` made as `upstream_id` for `owner`, from a
    /// call of `tool`, readable until `now + ttl_ms`. Returns the id the
    /// caller gets.
    pub async fn create_task_route(
        &self,
        owner: &str,
        (server, tool): (&str, &str),
        upstream_id: &str,
        now: i64,
        ttl_ms: i64,
    ) -> Result<String> {
        let id = URL_SAFE_NO_PAD.encode(random_bytes::<16>());
        self.query(
            "INSERT INTO tasks (id, owner, server, tool, upstream_id, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&id)
        .bind(owner)
        .bind(server)
        .bind(tool)
        .bind(upstream_id)
        .bind(now)
        .bind(now.saturating_add(ttl_ms))
        .execute(self.pool())
        .await?;
        Ok(id)
    }

    /// The task `id` of `owner`, unless it has expired. Another owner's
    /// task is `None`, as an unknown one is.
    pub async fn task_route(&self, owner: &str, id: &str, now: i64) -> Result<Option<TaskRoute>> {
        let row = self
            .query(
                "SELECT server, tool, upstream_id, expires_at FROM tasks \
                 WHERE id = $1 AND owner = $2 AND expires_at > $3",
            )
            .bind(id)
            .bind(owner)
            .bind(now)
            .fetch_optional(self.pool())
            .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(TaskRoute {
            id: id.to_string(),
            server: row.try_get("server")?,
            tool: row.try_get("tool")?,
            upstream_id: row.try_get("upstream_id")?,
            expires_at: row.try_get("expires_at")?,
        }))
    }

    /// Notes that task `id` was seen ended; true only the first time, so
    /// that its end is recorded once across replicas.
    pub async fn end_task_route(&self, id: &str, now: i64) -> Result<bool> {
        let done = self
            .query("UPDATE tasks SET ended_at = $2 WHERE id = $1 AND ended_at IS NULL")
            .bind(id)
            .bind(now)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Deletes tasks past their expiry (the sweep), passed-through and
    /// gateway-made, with what they kept. Returns how many.
    pub async fn sweep_tasks(&self, now: i64) -> Result<u64> {
        let mut swept = 0;
        for table in ["tasks", "gateway_tasks"] {
            let sql = format!("DELETE FROM {table} WHERE expires_at <= $1");
            let done = self.query(&sql).bind(now).execute(self.pool()).await?;
            swept += done.rows_affected();
        }
        Ok(swept)
    }
}
