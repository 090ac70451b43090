//! The audit writer task: commits rows through sqlx's pool, for PostgreSQL,
//! an in-memory SQLite, and a SQLite file whose journal cannot be made.
//!
//! Rows queue on a bounded channel; the task takes whatever is queued (up to
//! [`MAX_BATCH`]) and commits it at once, so under load one commit carries
//! many calls' rows. A row somebody waits for is written at once, with
//! whatever came before it; a row nobody waits for lingers up to [`LINGER`]
//! for company, so a call's access and activity rows share one commit. A
//! full queue makes callers wait rather than drop rows.

use sqlx::{Any, Connection, pool::PoolConnection};
use tokio::sync::{mpsc, oneshot};

use crate::{
    AuditRow, Result, Store,
    audit::{bind_row, insert_sql},
    batching::{AuditError, Done, LINGER, MAX_BATCH, QUEUE_CAPACITY, answer, fold_access_failures},
};

/// The writer keeps one connection while rows keep coming, and gives it
/// back to the pool after this long without any.
const IDLE_RELEASE: std::time::Duration = std::time::Duration::from_secs(1);

enum Job {
    Row(Box<AuditRow>, Option<Done>),
    Flush(Done),
    /// The linger of the oldest unawaited row is over (made by the task).
    Due,
}

/// A handle on the writer task; cheap to clone. The task ends when every
/// handle is gone and the queue is empty.
#[derive(Clone)]
pub(crate) struct SqlxTask(mpsc::Sender<Job>);

impl SqlxTask {
    /// Needs a Tokio runtime.
    pub(crate) fn start(store: Store) -> SqlxTask {
        let (jobs, queue) = mpsc::channel(QUEUE_CAPACITY);
        tokio::spawn(run(store, queue));
        SqlxTask(jobs)
    }

    /// Queues `row`; with `wait`, returns once it is committed.
    pub(crate) async fn record(&self, row: AuditRow, wait: bool) -> Result<(), AuditError> {
        if !wait {
            return self.send(Job::Row(Box::new(row), None)).await;
        }
        let (done, committed) = oneshot::channel();
        self.send(Job::Row(Box::new(row), Some(done))).await?;
        answer(committed).await
    }

    /// Returns once every row queued before this call is committed (or
    /// refused and logged).
    pub(crate) async fn flush(&self) -> Result<(), AuditError> {
        let (done, flushed) = oneshot::channel();
        self.send(Job::Flush(done)).await?;
        answer(flushed).await
    }

    async fn send(&self, job: Job) -> Result<(), AuditError> {
        self.0.send(job).await.map_err(|_| AuditError::Stopped)
    }
}

/// The writer's own connection, held while rows keep coming: a connection
/// from the pool per batch costs a liveness ping, and a connection that only
/// this task writes keeps SQLite's page cache warm.
struct Held {
    conn: Option<PoolConnection<Any>>,
    /// A pool of one (an in-memory SQLite) is never held.
    may_hold: bool,
}

async fn run(store: Store, mut queue: mpsc::Receiver<Job>) {
    let mut rows: Vec<AuditRow> = Vec::with_capacity(MAX_BATCH);
    let mut waiters = Vec::with_capacity(MAX_BATCH);
    let mut held = Held {
        conn: None,
        may_hold: store.pool().options().get_max_connections() > 1,
    };
    // When the oldest row nobody waits for must be written at the latest.
    let mut due: Option<tokio::time::Instant> = None;
    loop {
        let job = match (due, held.conn.is_some()) {
            (Some(due), _) => match tokio::time::timeout_at(due, queue.recv()).await {
                Ok(job) => job,
                Err(_elapsed) => Some(Job::Due),
            },
            (None, true) => match tokio::time::timeout(IDLE_RELEASE, queue.recv()).await {
                Ok(job) => job,
                Err(_idle) => {
                    held.conn = None;
                    continue;
                }
            },
            (None, false) => queue.recv().await,
        };
        let Some(job) = job else {
            // Every handle is gone: write what is left and stop.
            write(&store, &mut held, &mut rows, &mut waiters).await;
            return;
        };
        let mut next = Some(job);
        let mut flushing = false;
        while let Some(job) = next.take() {
            match job {
                Job::Row(row, done) => {
                    rows.push(*row);
                    waiters.extend(done);
                }
                Job::Flush(done) => {
                    waiters.push(done);
                    flushing = true;
                }
                Job::Due => due = Some(tokio::time::Instant::now()),
            }
            if rows.len() < MAX_BATCH {
                next = queue.try_recv().ok();
            }
        }
        let overdue = due.is_some_and(|due| due <= tokio::time::Instant::now());
        if !waiters.is_empty() || rows.len() >= MAX_BATCH || overdue {
            write(&store, &mut held, &mut rows, &mut waiters).await;
            due = None;
        } else if due.is_none() && !rows.is_empty() {
            // Rows nobody waits for (a request's access row, every row with
            // `audit_commit = "async"`) linger a little for company.
            due = Some(tokio::time::Instant::now() + LINGER);
        }
        if flushing {
            // A flush comes before a shutdown, which closes the pool.
            held.conn = None;
        }
    }
}

/// Commits `rows` and tells `waiters` how it went.
async fn write(store: &Store, held: &mut Held, rows: &mut Vec<AuditRow>, waiters: &mut Vec<Done>) {
    let written = if rows.is_empty() {
        Ok(())
    } else {
        write_batch(store, held, fold_access_failures(std::mem::take(rows))).await
    };
    for done in waiters.drain(..) {
        let _ = done.send(written);
    }
}

/// Writes `rows` in one transaction. If that fails, each row is tried on its
/// own, so one bad row does not take the others with it.
async fn write_batch(
    store: &Store,
    held: &mut Held,
    rows: Vec<AuditRow>,
) -> Result<(), AuditError> {
    let written = async {
        let conn = match &mut held.conn {
            Some(conn) => conn,
            slot => slot.insert(store.pool().acquire().await?),
        };
        if rows.len() == 1 {
            return insert(store, conn, &rows[0]).await;
        }
        let mut tx = conn.begin().await?;
        for row in &rows {
            insert(store, &mut tx, row).await?;
        }
        tx.commit().await?;
        Ok(())
    }
    .await;
    if !held.may_hold || written.is_err() {
        // After an error the connection may be the problem: take a fresh one.
        held.conn = None;
    }
    let Err(error) = written else { return Ok(()) };
    if rows.len() == 1 {
        tracing::error!(%error, "audit row not recorded");
        return Err(AuditError::NotRecorded);
    }
    tracing::warn!(%error, rows = rows.len(), "audit batch failed; writing its rows one by one");
    let mut all = Ok(());
    for row in &rows {
        let one = async {
            let mut conn = store.pool().acquire().await?;
            insert(store, &mut conn, row).await
        }
        .await;
        if let Err(error) = one {
            tracing::error!(%error, "audit row not recorded");
            all = Err(AuditError::NotRecorded);
        }
    }
    all
}

async fn insert(store: &Store, conn: &mut sqlx::AnyConnection, row: &AuditRow) -> Result<()> {
    bind_row(store.query(insert_sql(store.backend(), row)), row)?
        .execute(&mut *conn)
        .await?;
    Ok(())
}
