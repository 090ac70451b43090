//! The audit seam: every audit row of a gateway process goes through one
//! [`AuditWriter`], which commits many rows in one transaction (group
//! commit).
//!
//! Its verbs are few: [`AuditWriter::record`] a row,
//! [`AuditWriter::begin_request`] with the request's access row, and
//! [`AuditWriter::begin_call`] for a call whose row is on its way. Each
//! returns a `Result`, and the two `begin_` verbs a guard the caller holds
//! until the request is answered or the call's row recorded. How rows are
//! scheduled, journaled and lingered for company is the writer's business:
//! a guard only tells it what is still coming.
//!
//! Two writers stand behind it, and keep the same promises, the bound on
//! queued rows included:
//! - on a SQLite file, the callers journal their rows and a leader among
//!   them commits (`sqlite_leader.rs`, `journal.rs`);
//! - everywhere else (PostgreSQL, an in-memory SQLite, a SQLite file whose
//!   journal cannot be made) a task commits through sqlx (`sqlx_task.rs`).
//!
//! With [`AuditCommit::Sync`] (the default) `record` returns once the row is
//! durable: committed, or (a SQLite file) in the process's audit journal,
//! from which it is committed right after and which the next opener of the
//! database writes if the process dies first. A reply sent after it has
//! its row. With [`AuditCommit::Async`] it returns once the row is queued;
//! what a crash can lose is the queue, the lingering rows and the batch
//! being written (at most [`QUEUE_CAPACITY`] + [`MAX_BATCH`] rows, in
//! practice the last [`LINGER`] and a little more before the crash, and the
//! access rows of requests still being answered). [`AuditWriter::flush`]
//! (a clean stop) commits everything queued before it.
//!
//! Identical access failures in one batch (the same claimed token id and
//! reason, e.g. a client retrying a revoked token) are written as one row
//! whose `details.count` says how many there were.
//!
//! [`QUEUE_CAPACITY`]: crate::QUEUE_CAPACITY
//! [`MAX_BATCH`]: crate::MAX_BATCH
//! [`LINGER`]: crate::LINGER

use std::sync::Arc;

use crate::{
    AccessEvent, AuditRow, Store,
    batching::AuditError,
    sqlite_leader::{Coming, SqliteLeader, Until},
    sqlx_task::SqlxTask,
};

/// When a caller of [`AuditWriter::record`] gets control back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuditCommit {
    /// Once the row is durable.
    #[default]
    Sync,
    /// Once the row is queued.
    Async,
}

/// The audit writer of one process; cheap to clone.
#[derive(Clone)]
pub struct AuditWriter {
    sink: Sink,
    commit: AuditCommit,
}

/// Which writer commits the rows.
#[derive(Clone)]
enum Sink {
    Task(SqlxTask),
    Leader(Arc<SqliteLeader>),
}

impl std::fmt::Debug for AuditWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditWriter")
            .field("commit", &self.commit)
            .field(
                "sink",
                &match &self.sink {
                    Sink::Task(_) => "task",
                    Sink::Leader(_) => "sqlite leader",
                },
            )
            .finish()
    }
}

impl AuditWriter {
    /// Starts the writer on `store`: for a SQLite file, a connection and a
    /// journal of its own, else (or if either cannot be made) the writer
    /// task. Needs a Tokio runtime.
    pub fn start(store: Store, commit: AuditCommit) -> AuditWriter {
        let leader = store
            .sqlite_path()
            .map(|path| SqliteLeader::open(store.clone(), &path));
        let sink = match leader {
            Some(Ok(leader)) => Sink::Leader(leader),
            Some(Err(error)) => {
                tracing::warn!(%error, "audit: no journal of its own; rows go through the pool");
                Sink::Task(SqlxTask::start(store))
            }
            None => Sink::Task(SqlxTask::start(store)),
        };
        AuditWriter { sink, commit }
    }

    /// Records `row`, returning as [`AuditCommit`] says.
    pub async fn record(&self, row: AuditRow) -> Result<(), AuditError> {
        let durable = self.commit == AuditCommit::Sync;
        match &self.sink {
            Sink::Task(task) => task.record(row, durable).await,
            Sink::Leader(leader) => {
                let until = if durable {
                    Until::Durable
                } else {
                    Until::Queued
                };
                leader.record(Some(row), until).await
            }
        }
    }

    /// Begins a request with its access row, queued (whatever the mode)
    /// to go with the request's own rows. Hold the returned guard until the
    /// request is answered.
    pub async fn begin_request(&self, access: AccessEvent) -> Result<RequestRows, AuditError> {
        let row = AuditRow::Access(access);
        match &self.sink {
            Sink::Task(task) => {
                task.record(row, false).await?;
                Ok(RequestRows(None))
            }
            Sink::Leader(leader) => {
                leader.record(Some(row), Until::QueuedForRequest).await?;
                Ok(RequestRows(Some(Arc::clone(leader))))
            }
        }
    }

    /// Begins a call whose row is on its way (its upstream has yet to
    /// answer). Hold the returned guard until the row is recorded: while
    /// others are coming, the writer gathers rows before it commits, so
    /// that theirs join the transaction; a call alone never waits for
    /// anyone.
    pub fn begin_call(&self) -> Result<RowComing, AuditError> {
        Ok(RowComing {
            _held: match &self.sink {
                Sink::Leader(leader) => Some(leader.row_coming()),
                Sink::Task(_) => None,
            },
        })
    }

    /// Returns once every row recorded before this call is committed (or
    /// refused and logged).
    pub async fn flush(&self) -> Result<(), AuditError> {
        match &self.sink {
            Sink::Task(task) => task.flush().await,
            Sink::Leader(leader) => leader.flush().await,
        }
    }
}

/// A request still being answered; see [`AuditWriter::begin_request`].
#[derive(Default)]
pub struct RequestRows(Option<Arc<SqliteLeader>>);

impl Drop for RequestRows {
    /// Arms the linger of the request's access row if it is still queued:
    /// usually the request's own row has taken it along by then, and no
    /// timer wakes a thread for it.
    fn drop(&mut self) {
        if let Some(leader) = self.0.take() {
            leader.linger_queued();
        }
    }
}

/// A call whose row is on its way; see [`AuditWriter::begin_call`].
#[derive(Default)]
pub struct RowComing {
    _held: Option<Coming>,
}
