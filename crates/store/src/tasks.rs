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
    /// The replica whose connection made it, when the gateway knew its id.
    pub replica: Option<String>,
}

/// A passed-through task to record: whose it is, as the door knows them
/// (`owner`, the identity key) and as activity rows name them.
#[derive(Debug, Clone, Copy)]
pub struct NewTaskRoute<'a> {
    pub owner: &'a str,
    pub principal: &'a str,
    pub token_id: Option<&'a str>,
    pub server: &'a str,
    /// The qualified tool whose call made the task.
    pub tool: &'a str,
    pub upstream_id: &'a str,
    /// The replica whose connection made it.
    pub replica: Option<&'a str>,
}

/// A passed-through task the sweep deleted before anybody saw it end:
/// its end row is the sweep's to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnseenTaskEnd {
    pub id: String,
    pub principal: String,
    pub token_id: Option<String>,
    pub tool: String,
}

/// What one sweep of the task tables deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TasksSwept {
    /// Rows of both tables.
    pub swept: u64,
    pub unseen: Vec<UnseenTaskEnd>,
}

impl Store {
    /// Records `task`, readable until `now + ttl_ms`. Returns the id the
    /// caller gets.
    pub async fn create_task_route(
        &self,
        task: NewTaskRoute<'_>,
        now: i64,
        ttl_ms: i64,
    ) -> Result<String> {
        let id = URL_SAFE_NO_PAD.encode(random_bytes::<16>());
        self.query(
            "INSERT INTO tasks (id, owner, principal, token_id, server, tool, upstream_id, \
             replica, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&id)
        .bind(task.owner)
        .bind(task.principal)
        .bind(task.token_id)
        .bind(task.server)
        .bind(task.tool)
        .bind(task.upstream_id)
        .bind(task.replica)
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
                "SELECT server, tool, upstream_id, expires_at, replica FROM tasks \
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
            replica: row.try_get("replica")?,
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
    /// gateway-made, with what they kept. A passed-through task never seen
    /// ended is returned, once: `RETURNING` hands each row to the one
    /// replica whose delete took it.
    pub async fn sweep_tasks(&self, now: i64) -> Result<TasksSwept> {
        let rows = self
            .query(
                "DELETE FROM tasks WHERE expires_at <= $1 \
                 RETURNING id, owner, principal, token_id, tool, ended_at",
            )
            .bind(now)
            .fetch_all(self.pool())
            .await?;
        let mut swept = TasksSwept {
            swept: rows.len() as u64,
            unseen: Vec::new(),
        };
        for row in rows {
            if row.try_get::<Option<i64>, _>("ended_at")?.is_some() {
                continue;
            }
            // A row written before principals were kept names its owner.
            let principal: String = row.try_get("principal")?;
            swept.unseen.push(UnseenTaskEnd {
                id: row.try_get("id")?,
                principal: if principal.is_empty() {
                    row.try_get("owner")?
                } else {
                    principal
                },
                token_id: row.try_get("token_id")?,
                tool: row.try_get("tool")?,
            });
        }
        let done = self
            .query("DELETE FROM gateway_tasks WHERE expires_at <= $1")
            .bind(now)
            .execute(self.pool())
            .await?;
        swept.swept += done.rows_affected();
        Ok(swept)
    }
}
