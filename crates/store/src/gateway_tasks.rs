//! Tasks the gateway makes itself (a long call to an upstream without the
//! tasks extension): their state, kept where every replica reads it. The
//! store holds the payload as it is given, sealed by the caller; it never
//! sees the key.

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use sqlx::Row;

use crate::{Result, Store, random_bytes};

/// Where a gateway-made task stands.
pub const TASK_WORKING: &str = "working";

/// A task to record, running on `replica`.
#[derive(Debug, Clone)]
pub struct NewGatewayTask<'a> {
    pub owner: &'a str,
    pub server: &'a str,
    pub tool: &'a str,
    pub replica: &'a str,
    pub now: i64,
    pub ttl_ms: i64,
    /// How many unexpired working tasks `owner` may have, this one included.
    pub max_open: u64,
}

/// One gateway-made task as its owner may read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayTask {
    pub id: String,
    pub server: String,
    pub tool: String,
    pub replica: String,
    /// `working`, `completed`, `failed` or `cancelled`.
    pub status: String,
    pub message: Option<String>,
    /// The sealed result or error of a finished task.
    pub payload: Option<String>,
    pub cancel_requested: bool,
    pub created_at: i64,
    pub updated_at: i64,
    pub expires_at: i64,
}

impl Store {
    /// Records a working task for `new.owner`, unless the owner already has
    /// `max_open` working ones (`None` then). Returns the task's random id.
    /// The count and the insert are two statements: replicas racing may
    /// pass the limit by the few tasks they create at the same moment.
    pub async fn create_gateway_task(&self, new: &NewGatewayTask<'_>) -> Result<Option<String>> {
        if self.open_gateway_tasks(new.owner, new.now).await? >= new.max_open {
            return Ok(None);
        }
        let id = URL_SAFE_NO_PAD.encode(random_bytes::<16>());
        self.query(
            "INSERT INTO gateway_tasks (id, owner, server, tool, replica, status, \
             created_at, updated_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8)",
        )
        .bind(&id)
        .bind(new.owner)
        .bind(new.server)
        .bind(new.tool)
        .bind(new.replica)
        .bind(TASK_WORKING)
        .bind(new.now)
        .bind(new.now.saturating_add(new.ttl_ms))
        .execute(self.pool())
        .await?;
        Ok(Some(id))
    }

    /// How many unexpired tasks `owner` has working.
    pub async fn open_gateway_tasks(&self, owner: &str, now: i64) -> Result<u64> {
        let row = self
            .query(
                "SELECT COUNT(*) AS open FROM gateway_tasks \
                 WHERE owner = $1 AND status = $2 AND expires_at > $3",
            )
            .bind(owner)
            .bind(TASK_WORKING)
            .bind(now)
            .fetch_one(self.pool())
            .await?;
        let open: i64 = row.try_get("open")?;
        Ok(u64::try_from(open).unwrap_or(0))
    }

    /// The task `id` of `owner`, unless it has expired; another owner's is
    /// `None`, as an unknown one is.
    pub async fn gateway_task(
        &self,
        owner: &str,
        id: &str,
        now: i64,
    ) -> Result<Option<GatewayTask>> {
        let row = self
            .query(
                "SELECT server, tool, replica, status, message, payload, cancel_requested_at, \
                 created_at, updated_at, expires_at FROM gateway_tasks \
                 WHERE id = $1 AND owner = $2 AND expires_at > $3",
            )
            .bind(id)
            .bind(owner)
            .bind(now)
            .fetch_optional(self.pool())
            .await?;
        let Some(row) = row else { return Ok(None) };
        let cancel: Option<i64> = row.try_get("cancel_requested_at")?;
        Ok(Some(GatewayTask {
            id: id.to_string(),
            server: row.try_get("server")?,
            tool: row.try_get("tool")?,
            replica: row.try_get("replica")?,
            status: row.try_get("status")?,
            message: row.try_get("message")?,
            payload: row.try_get("payload")?,
            cancel_requested: cancel.is_some(),
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
            expires_at: row.try_get("expires_at")?,
        }))
    }

    /// Ends a working task with `status`, its message and sealed payload.
    /// Returns whether it was still working (an end is written once).
    pub async fn finish_gateway_task(
        &self,
        id: &str,
        status: &str,
        message: Option<&str>,
        payload: Option<&str>,
        now: i64,
    ) -> Result<bool> {
        let done = self
            .query(
                "UPDATE gateway_tasks SET status = $1, message = $2, payload = $3, updated_at = $4 \
                 WHERE id = $5 AND status = $6",
            )
            .bind(status)
            .bind(message)
            .bind(payload)
            .bind(now)
            .bind(id)
            .bind(TASK_WORKING)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Asks `owner`'s working task `id` to stop. Returns the replica that
    /// runs it, or `None` when there is no such working task.
    pub async fn request_gateway_task_cancel(
        &self,
        owner: &str,
        id: &str,
        now: i64,
    ) -> Result<Option<String>> {
        let Some(task) = self.gateway_task(owner, id, now).await? else {
            return Ok(None);
        };
        if task.status != TASK_WORKING {
            return Ok(None);
        }
        self.query(
            "UPDATE gateway_tasks SET cancel_requested_at = $1, updated_at = $1 \
             WHERE id = $2 AND status = $3",
        )
        .bind(now)
        .bind(id)
        .bind(TASK_WORKING)
        .execute(self.pool())
        .await?;
        Ok(Some(task.replica))
    }

    /// The working tasks on `replica` whose owners asked them to stop: what
    /// a replica re-reads when it may have missed the events that said so.
    pub async fn cancel_requested_gateway_tasks(&self, replica: &str) -> Result<Vec<String>> {
        let rows = self
            .query(
                "SELECT id FROM gateway_tasks \
                 WHERE replica = $1 AND status = $2 AND cancel_requested_at IS NOT NULL",
            )
            .bind(replica)
            .bind(TASK_WORKING)
            .fetch_all(self.pool())
            .await?;
        rows.iter()
            .map(|row| row.try_get("id").map_err(Into::into))
            .collect()
    }

    /// Marks every task `replica` was running as failed with `message`: a
    /// restarted process no longer runs them. Returns how many.
    pub async fn fail_gateway_tasks_of(
        &self,
        replica: &str,
        message: &str,
        now: i64,
    ) -> Result<u64> {
        let done = self
            .query(
                "UPDATE gateway_tasks SET status = 'failed', message = $1, updated_at = $2 \
                 WHERE replica = $3 AND status = $4",
            )
            .bind(message)
            .bind(now)
            .bind(replica)
            .bind(TASK_WORKING)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected())
    }
}
