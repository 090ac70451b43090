//! The audit writer: every audit row of a gateway process goes through it,
//! and it commits many rows in one transaction (group commit).
//!
//! On a SQLite file the rows are committed on the callers' own threads by a
//! leader among them (`inline_sqlite.rs`): no trip to sqlx's worker thread.
//! Everywhere else (PostgreSQL, an in-memory SQLite) a task does it, as
//! below; both keep the same promises, the bound on queued rows included.
//!
//! Rows queue on a bounded channel; the task takes whatever is queued (up to
//! [`MAX_BATCH`]) and commits it at once, so under load one commit carries
//! many calls' rows. A row somebody waits for is written at once, with
//! whatever came before it; a row nobody waits for (a request's access row,
//! or any row with `Async`) lingers up to [`LINGER`] for company, so a
//! call's access and activity rows share one commit. A request's access row
//! lingers from the end of the request ([`RequestRows`]): usually its own
//! row has taken it along by then, and no timer wakes a thread for it. A
//! full queue makes callers wait rather than drop rows.
//!
//! With [`AuditCommit::Sync`] (the default) [`AuditWriter::record`] returns
//! once the row is durable: committed, or (a SQLite file) in the process's
//! audit journal, from which it is committed right after and which the next
//! opener of the database writes if the process dies first (`journal.rs`).
//! A reply sent after it has its row. With
//! [`AuditCommit::Async`] it returns once the row is queued; what a crash
//! can lose is the queue, the lingering rows and the batch being written (at
//! most [`QUEUE_CAPACITY`] + [`MAX_BATCH`] rows, in practice the last
//! [`LINGER`] and a little more before the crash, and the access rows of
//! requests still being answered). [`AuditWriter::flush`] (a clean stop)
//! commits everything queued before it.
//!
//! Identical access failures in one batch (the same claimed token id and
//! reason, e.g. a client retrying a revoked token) are written as one row
//! whose `details.count` says how many there were.

use std::{collections::HashMap, sync::Arc};

use serde_json::json;
use sqlx::{Any, Connection, pool::PoolConnection};
use tokio::sync::{mpsc, oneshot};

use crate::{
    AccessEvent, AccessOutcome, ActivityEvent, AuditKind, DiscoveryEvent, Result, Store,
    audit::{bind_row, insert_sql},
    inline_sqlite::{InlineSqlite, Until},
};

/// SQLite batches up to this many rows go as one statement list (a call's
/// access and activity rows, a few calls at once). Such lists recur with
/// few shapes, so sqlx's statement cache keeps them prepared; a larger one
/// would be prepared anew each time, which costs more than the trips to
/// sqlx's worker thread it saves (measured with 16 callers).
const STATEMENT_LIST_ROWS: usize = 4;

/// The most rows one transaction carries.
pub const MAX_BATCH: usize = 512;
/// Rows that may wait for the writer before callers are made to wait.
pub const QUEUE_CAPACITY: usize = 8192;
/// How long a row nobody waits for may wait for others to share its commit.
pub const LINGER: std::time::Duration = std::time::Duration::from_millis(5);
/// The writer keeps one connection while rows keep coming, and gives it
/// back to the pool after this long without any.
pub const IDLE_RELEASE: std::time::Duration = std::time::Duration::from_secs(1);

/// When a caller of [`AuditWriter::record`] gets control back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuditCommit {
    /// Once the row is committed.
    #[default]
    Sync,
    /// Once the row is queued.
    Async,
}

/// One row for one of the three trails.
#[derive(Debug, Clone)]
pub enum AuditRow {
    Discovery(DiscoveryEvent),
    Access(AccessEvent),
    Activity(ActivityEvent),
}

impl AuditRow {
    /// The trail this row goes to.
    pub fn kind(&self) -> AuditKind {
        match self {
            AuditRow::Discovery(_) => AuditKind::Discovery,
            AuditRow::Access(_) => AuditKind::Access,
            AuditRow::Activity(_) => AuditKind::Activity,
        }
    }
}

enum Job {
    Row(Box<AuditRow>, Option<oneshot::Sender<()>>),
    Flush(oneshot::Sender<()>),
    /// The linger of the oldest unawaited row is over (made by the task).
    Due,
}

/// A handle on the writer task; cheap to clone. The task ends when every
/// handle is gone and the queue is empty.
#[derive(Clone)]
pub struct AuditWriter {
    sink: Sink,
    commit: AuditCommit,
}

/// Where rows go: the writer task, or (a SQLite file) committed on the
/// caller's thread by [`InlineSqlite`].
#[derive(Clone)]
enum Sink {
    Task(mpsc::Sender<Job>),
    Inline(Arc<InlineSqlite>),
}

impl std::fmt::Debug for AuditWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditWriter")
            .field("commit", &self.commit)
            .field(
                "sink",
                &match &self.sink {
                    Sink::Task(_) => "task",
                    Sink::Inline(_) => "inline",
                },
            )
            .finish()
    }
}

impl AuditWriter {
    /// Starts the writer on `store`: for a SQLite file, a connection of its
    /// own that callers commit on; otherwise the writer task. Needs a Tokio
    /// runtime.
    pub fn start(store: Store, commit: AuditCommit) -> AuditWriter {
        AuditWriter::start_with(store, commit, true)
    }

    /// As [`AuditWriter::start`], but a SQLite file's writer keeps no
    /// journal: a sync row is committed before its caller goes on, as when
    /// the journal cannot be created. For tests of the commit itself.
    pub fn start_unjournaled(store: Store, commit: AuditCommit) -> AuditWriter {
        AuditWriter::start_with(store, commit, false)
    }

    fn start_with(store: Store, commit: AuditCommit, journal: bool) -> AuditWriter {
        if let Some(path) = store.sqlite_path() {
            match InlineSqlite::open(store.clone(), &path, journal) {
                Ok(inline) => {
                    return AuditWriter {
                        sink: Sink::Inline(inline),
                        commit,
                    };
                }
                Err(error) => {
                    tracing::warn!(%error, "audit: no connection of its own; rows go through the pool")
                }
            }
        }
        let (jobs, queue) = mpsc::channel(QUEUE_CAPACITY);
        tokio::spawn(run(store, queue));
        AuditWriter {
            sink: Sink::Task(jobs),
            commit,
        }
    }

    pub fn commit(&self) -> AuditCommit {
        self.commit
    }

    /// Records `row`, returning as [`AuditCommit`] says. A row the database
    /// refused is logged by the writer.
    pub async fn record(&self, row: AuditRow) {
        match self.commit {
            AuditCommit::Sync => self.record_committed(row).await,
            AuditCommit::Async => self.record_queued(row).await,
        }
    }

    /// Records `row` and returns once it is committed, whatever the mode.
    pub async fn record_committed(&self, row: AuditRow) {
        let jobs = match &self.sink {
            Sink::Task(jobs) => jobs,
            Sink::Inline(inline) => return inline.record(Some(row), Until::Committed).await,
        };
        let (done, committed) = oneshot::channel();
        if jobs.send(Job::Row(Box::new(row), Some(done))).await.is_ok() {
            let _ = committed.await;
        }
    }

    /// Queues `row` and returns; it is committed with the next batch.
    pub async fn record_queued(&self, row: AuditRow) {
        match &self.sink {
            Sink::Task(jobs) => {
                let _ = jobs.send(Job::Row(Box::new(row), None)).await;
            }
            Sink::Inline(inline) => inline.record(Some(row), Until::Queued).await,
        }
    }

    /// Queues `row` like [`AuditWriter::record_queued`] for a request still
    /// running (its access row): the row lingers for company from when the
    /// returned [`RequestRows`] drops, not from now. Meanwhile it joins any
    /// commit, the request's own activity or discovery row's first.
    pub async fn record_for_request(&self, row: AuditRow) -> RequestRows {
        match &self.sink {
            Sink::Task(jobs) => {
                let _ = jobs.send(Job::Row(Box::new(row), None)).await;
                RequestRows(None)
            }
            Sink::Inline(inline) => {
                inline.record(Some(row), Until::QueuedForRequest).await;
                RequestRows(Some(Arc::clone(inline)))
            }
        }
    }

    /// Marks a call whose row is on its way (its upstream has yet to
    /// answer) until the guard drops. While others are coming, a leader
    /// yields once before it commits, so their rows can join its
    /// transaction; a call alone never waits for anyone.
    pub fn row_coming(&self) -> RowComing {
        RowComing {
            _held: match &self.sink {
                Sink::Inline(inline) => Some(inline.row_coming()),
                Sink::Task(_) => None,
            },
        }
    }

    /// Polls `work` (a call's upstream request, pinned by the caller); the
    /// first time it waits, a lone caller commits the rows lingering for
    /// company (its access row) then and there, so that commit overlaps the
    /// wait instead of adding its pages to the reply's commit. See
    /// [`InlineSqlite::commit_lingering`]; other sinks just poll `work`.
    /// `work` is borrowed, not moved: a call's future is kilobytes, and each
    /// move is a copy that size.
    pub fn commit_lingering_during<'a, F: Future>(
        &'a self,
        mut work: std::pin::Pin<&'a mut F>,
    ) -> impl Future<Output = F::Output> + Unpin + 'a {
        let mut inline = match &self.sink {
            Sink::Inline(inline) => Some(inline),
            Sink::Task(_) => None,
        };
        std::future::poll_fn(move |cx| {
            let polled = work.as_mut().poll(cx);
            if polled.is_pending()
                && let Some(inline) = inline.take()
            {
                inline.commit_lingering();
            }
            polled
        })
    }

    /// Returns once every row queued before this call is committed (or
    /// refused and logged).
    pub async fn flush(&self) {
        let jobs = match &self.sink {
            Sink::Task(jobs) => jobs,
            Sink::Inline(inline) => return inline.record(None, Until::Committed).await,
        };
        let (done, flushed) = oneshot::channel();
        if jobs.send(Job::Flush(done)).await.is_ok() {
            let _ = flushed.await;
        }
    }
}

/// The queued rows of a request that is still running; dropped as the
/// request ends, it arms their linger if they are still queued. See
/// [`AuditWriter::record_for_request`].
#[derive(Default)]
pub struct RequestRows(Option<Arc<InlineSqlite>>);

impl Drop for RequestRows {
    fn drop(&mut self) {
        if let Some(inline) = self.0.take() {
            inline.linger_queued();
        }
    }
}

/// See [`AuditWriter::row_coming`].
pub struct RowComing {
    _held: Option<crate::inline_sqlite::Coming>,
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

async fn write(
    store: &Store,
    held: &mut Held,
    rows: &mut Vec<AuditRow>,
    waiters: &mut Vec<oneshot::Sender<()>>,
) {
    if !rows.is_empty() {
        store
            .write_audit_batch(held, fold_access_failures(std::mem::take(rows)))
            .await;
    }
    for done in waiters.drain(..) {
        let _ = done.send(());
    }
}

/// Identical access failures become one row with a count; everything else
/// keeps its order.
pub(crate) fn fold_access_failures(rows: Vec<AuditRow>) -> Vec<AuditRow> {
    let mut out: Vec<AuditRow> = Vec::with_capacity(rows.len());
    let mut seen: HashMap<(Option<String>, Option<String>), (usize, u64)> = HashMap::new();
    for row in rows {
        if let AuditRow::Access(event) = &row
            && event.outcome == AccessOutcome::Failure
        {
            let key = (event.token_id.clone(), event.reason.clone());
            if let Some((at, count)) = seen.get_mut(&key) {
                *count += 1;
                if let AuditRow::Access(first) = &mut out[*at] {
                    first.details["count"] = json!(*count);
                }
                continue;
            }
            seen.insert(key, (out.len(), 1));
        }
        out.push(row);
    }
    out
}

impl Store {
    /// Writes `rows` in one transaction. If that fails, each row is tried
    /// on its own, so one bad row does not take the others with it.
    async fn write_audit_batch(&self, held: &mut Held, rows: Vec<AuditRow>) {
        let written = async {
            let conn = match &mut held.conn {
                Some(conn) => conn,
                slot => slot.insert(self.pool().acquire().await?),
            };
            if rows.len() == 1 {
                return self.insert_audit_row(conn, &rows[0]).await;
            }
            if self.backend() == crate::Backend::Sqlite && rows.len() <= STATEMENT_LIST_ROWS {
                return self.insert_sqlite_batch(conn, &rows).await;
            }
            let mut tx = conn.begin().await?;
            for row in &rows {
                self.insert_audit_row(&mut tx, row).await?;
            }
            tx.commit().await?;
            Ok(())
        }
        .await;
        if !held.may_hold || written.is_err() {
            // After an error the connection may be the problem: take a fresh one.
            held.conn = None;
        }
        let Err(error) = written else { return };
        if rows.len() == 1 {
            tracing::error!(%error, "audit row not recorded");
            return;
        }
        tracing::warn!(%error, rows = rows.len(), "audit batch failed; writing its rows one by one");
        for row in &rows {
            let one = async {
                let mut conn = self.pool().acquire().await?;
                self.insert_audit_row(&mut conn, row).await
            }
            .await;
            if let Err(error) = one {
                tracing::error!(%error, "audit row not recorded");
            }
        }
    }

    async fn insert_audit_row(&self, conn: &mut sqlx::AnyConnection, row: &AuditRow) -> Result<()> {
        bind_row(self.query(insert_sql(self.backend(), row)), row)?
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// A small SQLite batch as one statement list, `BEGIN` to `COMMIT`: one
    /// trip to sqlx's worker thread for the whole batch instead of one per
    /// statement. Rolled back if any statement fails.
    async fn insert_sqlite_batch(
        &self,
        conn: &mut sqlx::AnyConnection,
        rows: &[AuditRow],
    ) -> Result<()> {
        let mut sql = String::from("BEGIN;\n");
        for row in rows {
            sql.push_str(insert_sql(crate::Backend::Sqlite, row));
            sql.push_str(";\n");
        }
        sql.push_str("COMMIT;");
        let mut query = self.query(&sql);
        for row in rows {
            query = bind_row(query, row)?;
        }
        let written = query.execute(&mut *conn).await;
        if written.is_err() {
            let _ = self.query("ROLLBACK").execute(&mut *conn).await;
        }
        written?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_access_failures_fold_into_one_row_with_a_count() {
        let fail =
            |id: &str, reason: &str| AuditRow::Access(AccessEvent::failure(1, Some(id), reason));
        let rows = vec![
            fail("a", "revoked"),
            AuditRow::Access(AccessEvent::success(1, "token:a", Some("a"))),
            fail("a", "revoked"),
            fail("b", "revoked"),
            fail("a", "revoked"),
            fail("a", "expired"),
        ];
        let folded = fold_access_failures(rows);
        let summary: Vec<(String, Option<u64>)> = folded
            .iter()
            .map(|row| match row {
                AuditRow::Access(e) => (
                    format!(
                        "{}:{}",
                        e.token_id.as_deref().unwrap_or(""),
                        e.reason.as_deref().unwrap_or("ok")
                    ),
                    e.details.get("count").and_then(|c| c.as_u64()),
                ),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("a:revoked".to_string(), Some(3)),
                ("a:ok".to_string(), None),
                ("b:revoked".to_string(), None),
                ("a:expired".to_string(), None),
            ]
        );
    }
}
