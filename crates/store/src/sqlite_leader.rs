//! SQLite audit rows, journaled by their callers and committed by a leader
//! among them on its own thread.
//!
//! sqlx runs every SQLite statement on a worker thread of its own, so a
//! row committed through it costs a trip there and back: two thread
//! wake-ups per call, plus one more to a writer task. On a virtual machine
//! those wake-ups cost more than the insert itself. Here a row somebody
//! waits for (`Until::Durable`, a sync reply's row) is appended by its
//! caller, with any rows queued before it, to this process's audit journal
//! (`journal.rs`) in one `write`, and the caller goes on. The rows then
//! linger for company, so calls one at a time share a commit too, and the
//! transaction records how far the journal is committed.
//!
//! Whoever finds nobody writing when rows are due becomes the leader (the
//! linger's timer, a flush, a caller whose row the journal could not take):
//! it takes everything queued and commits it in one transaction on its own
//! thread, with an uncontended write lock that takes tens of microseconds.
//! With company it yields first, so that the calls its thread has ready
//! join that transaction. Callers that arrive meanwhile queue their rows;
//! the leader takes them in its next round.
//!
//! The leader never waits for SQLite's write lock on the runtime's
//! threads. If another connection holds it (a catalog refresh, a governance
//! write), or the leader has written a few rounds in a row, the rest of
//! the work moves to a blocking thread, which may wait up to
//! [`BUSY_WAIT`]. Checkpoints too: every [`CHECKPOINT_EVERY`] commits the
//! leader hands its role to a blocking thread, which checkpoints on this
//! connection before it takes the queue. As the leader it knows that no
//! audit commit lands meanwhile, so the checkpoint catches up and the next
//! commit starts the log afresh. A checkpoint beside the writers (on sqlx's
//! thread) never caught up under sustained calls, and the log grew by every
//! commit's pages.

use std::{
    path::Path,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use rusqlite::{Connection, OpenFlags, ToSql, types::ToSqlOutput};
use tokio::sync::oneshot;

use crate::{
    AuditRow, Backend, Store,
    audit::{Cell, insert_sql, insert_sql_for, row_cells},
    batching::{AuditError, Done, LINGER, QUEUE_CAPACITY, answer, fold_access_failures},
    journal::{self, Journal, JournaledRow},
};

/// How long a leader on a blocking thread waits for another connection's
/// write lock, as sqlx's SQLite connections do.
const BUSY_WAIT: Duration = Duration::from_secs(5);
/// Rounds a leader writes on the runtime's thread before it hands the rest
/// to a blocking thread, so one caller's reply is not held by everyone else's rows.
const INLINE_ROUNDS: usize = 4;
/// The most times a leader with company yields to gather rows before it
/// commits (it stops early once a yield brings none).
const GATHER_YIELDS: usize = 4;
/// Commits between passive checkpoints.
const CHECKPOINT_EVERY: u64 = 256;
/// Rows refused one after another, none written, after which a batch
/// counts as refused whole (the database refuses everything) and the rest
/// are not tried one by one.
const REFUSED_ALL_AFTER: usize = 8;

/// When [`SqliteLeader::record`] returns.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Until {
    /// Once the row is durable: in the journal, else committed. A flush
    /// (no row) waits for the commit.
    Durable,
    /// Once it is queued; it lingers up to [`LINGER`] for company.
    Queued,
    /// Once it is queued; it lingers from [`SqliteLeader::linger_queued`],
    /// as its request ends.
    QueuedForRequest,
}

pub(crate) struct SqliteLeader {
    store: Store,
    state: Mutex<State>,
    conn: Mutex<Connection>,
    commits: AtomicU64,
    /// Set every [`CHECKPOINT_EVERY`] commits; the leader checkpoints.
    checkpoint_due: AtomicBool,
    lingering: AtomicBool,
    /// The last leader had company: more than one waiting caller in its
    /// first batch, or a further round.
    company: AtomicBool,
    /// Calls whose rows are on their way ([`Coming`]). A leader yields
    /// before it writes only with company or others coming.
    coming: Arc<AtomicUsize>,
    /// The name of this process's journal (its mark's key).
    journal_name: String,
    journal_path: std::path::PathBuf,
    /// Where rows the database refused on their own are kept.
    refused_path: std::path::PathBuf,
}

/// One call whose row is on its way; counted in [`SqliteLeader::coming`]
/// until dropped.
pub(crate) struct Coming(Arc<AtomicUsize>);

impl Drop for Coming {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

struct State {
    queue: Vec<Pending>,
    /// A leader is writing: new rows wait for its next round.
    writing: bool,
    journal: Journal,
    /// How many rows at the front of `queue` are in the journal.
    journaled: usize,
    /// The journal's last sequence number taken into a batch, and the last
    /// one committed (its mark). Between them: rows a failed commit left in
    /// the journal, which the next commit carries again.
    taken: u64,
    committed: u64,
}

/// A row to write (none for a flush), and whoever waits for its commit.
struct Pending {
    row: Option<AuditRow>,
    done: Option<Done>,
}

/// What one transaction carries.
#[derive(Default)]
struct Batch {
    rows: Vec<AuditRow>,
    waiters: Vec<Done>,
    /// The journal's sequence number of the last journaled row among `rows`.
    journaled_to: Option<u64>,
    /// Journaled rows a failed commit left behind, (after, upto]: read
    /// again from the journal and written first.
    backlog: Option<(u64, u64)>,
}

impl Batch {
    /// How far the journal is committed once this batch is.
    fn mark_to(&self) -> Option<u64> {
        self.journaled_to.or(self.backlog.map(|(_, upto)| upto))
    }
}

impl SqliteLeader {
    /// A connection of its own to the store's SQLite file, and a journal of
    /// this process's own beside it.
    pub(crate) fn open(store: Store, path: &Path) -> std::io::Result<Arc<SqliteLeader>> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(std::io::Error::other)?;
        // As the pool's connections: WAL (a property of the file, set when
        // the store opened), NORMAL sync, foreign keys for the token lookup.
        conn.execute_batch(
            "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; PRAGMA wal_autocheckpoint = 0;",
        )
        .map_err(std::io::Error::other)?;
        let journal = Journal::create(path)?;
        // A journal's mark exists from its start to its end, so a reader
        // that finds none knows every row the file holds is committed.
        conn.busy_timeout(BUSY_WAIT)
            .and_then(|()| conn.execute(journal::MARK_SQL, rusqlite::params![journal.name(), 0]))
            .map_err(std::io::Error::other)?;
        let leader = Arc::new(SqliteLeader {
            store: store.clone(),
            journal_name: journal.name().to_string(),
            journal_path: journal.path().to_path_buf(),
            refused_path: journal::refused_path(path),
            state: Mutex::new(State {
                queue: Vec::new(),
                writing: false,
                journal,
                journaled: 0,
                taken: 0,
                committed: 0,
            }),
            conn: Mutex::new(conn),
            commits: AtomicU64::new(0),
            checkpoint_due: AtomicBool::new(false),
            lingering: AtomicBool::new(false),
            company: AtomicBool::new(false),
            coming: Arc::default(),
        });
        store.register_leader(&leader);
        Ok(leader)
    }

    /// Returns once every row queued so far is committed.
    pub(crate) async fn flush(self: &Arc<Self>) -> Result<(), AuditError> {
        self.record(None, Until::Durable).await
    }

    pub(crate) fn row_coming(&self) -> Coming {
        self.coming.fetch_add(1, Ordering::Relaxed);
        Coming(Arc::clone(&self.coming))
    }

    /// Queues `row` (none: a flush of everything queued before it) and
    /// returns as `until` says; when [`QUEUE_CAPACITY`] rows are queued
    /// already, or the journal does not take the row, once it is committed
    /// whatever `until` says. A caller that waits writes the queue here if
    /// nobody is writing.
    pub(crate) async fn record(
        self: &Arc<Self>,
        row: Option<AuditRow>,
        until: Until,
    ) -> Result<(), AuditError> {
        let mut committed = None;
        let (lead, journaled) = {
            let mut state = lock(&self.state);
            // A full queue makes callers wait rather than grow without bound.
            let full = state.queue.len() >= QUEUE_CAPACITY;
            let has_row = row.is_some();
            state.queue.push(Pending { row, done: None });
            // A row in the journal is as safe as a committed one.
            let journaled =
                until == Until::Durable && has_row && !full && append_journal(&mut state);
            let wait = !journaled && (until == Until::Durable || full);
            if wait {
                let (done, receiver) = oneshot::channel();
                committed = Some(receiver);
                if let Some(pending) = state.queue.last_mut() {
                    pending.done = Some(done);
                }
            }
            let lead = wait && !state.writing;
            state.writing |= lead;
            (lead, journaled)
        };
        if journaled {
            self.linger();
            return Ok(());
        }
        if lead {
            // Leader. Under load, a yield first lets the calls this thread
            // has ready reach their audit row and join this commit. It
            // yields again while the last yield brought rows, up to
            // [`GATHER_YIELDS`] times: a commit costs far more than a row.
            // Alone it skips them: a yield would wake the other worker for
            // nothing. (The leader's own call, if any, counts as coming.)
            let claim = Claim(Some(self));
            if self.has_company() {
                let mut queued = self.queued();
                for _ in 0..GATHER_YIELDS {
                    tokio::task::yield_now().await;
                    let now = self.queued();
                    if now == queued {
                        break;
                    }
                    queued = now;
                }
            }
            claim.lead();
        } else if committed.is_none() && until == Until::Queued {
            self.linger();
        }
        match committed {
            Some(committed) => answer(committed).await,
            None => Ok(()),
        }
    }

    fn queued(&self) -> usize {
        lock(&self.state).queue.len()
    }

    /// The last leader had company, or another call's row is on its way
    /// (the caller's own counts as one).
    fn has_company(&self) -> bool {
        self.company.load(Ordering::Relaxed) || self.coming.load(Ordering::Relaxed) > 1
    }

    /// Becomes the leader and takes the queue, unless somebody is writing
    /// or nothing is queued.
    fn take_lead(&self) -> Option<Batch> {
        let mut state = lock(&self.state);
        if state.writing || state.queue.is_empty() {
            return None;
        }
        state.writing = true;
        Some(take_batch(&mut state))
    }

    /// Arms the linger timer if rows are queued and nobody is writing (a
    /// leader takes what is queued before it steps down). For a request
    /// that deferred its row's linger, as it ends: most such rows were
    /// committed meanwhile with the request's own row, and a timer armed
    /// for each would wake a thread for nothing.
    pub(crate) fn linger_queued(self: &Arc<Self>) {
        let queued = {
            let state = lock(&self.state);
            !state.queue.is_empty() && !state.writing
        };
        if !queued {
            return;
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            self.linger();
        } else if let Some(batch) = self.take_lead() {
            self.lead(batch, true);
        }
    }

    /// Arms one timer for the lingering rows.
    fn linger(self: &Arc<Self>) {
        if self.lingering.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(LINGER).await;
            this.lingering.store(false, Ordering::Release);
            if let Some(batch) = this.take_lead() {
                this.lead(batch, false);
            }
        });
    }

    /// Writes `batch` and every batch queued behind it, then steps down.
    /// With `may_wait` false (a runtime thread), a busy database or a long
    /// streak hands the rest to a blocking thread.
    fn lead(self: &Arc<Self>, mut batch: Batch, may_wait: bool) {
        let mut round = 0;
        let company = batch.waiters.len() > 1;
        loop {
            if let Err(busy) = self.write(batch, may_wait) {
                return self.hand_off(busy);
            }
            round += 1;
            if self.checkpoint_due.load(Ordering::Relaxed) {
                // A checkpoint copies pages and syncs the file: not on a
                // runtime thread. Still the leader, so no commit lands meanwhile.
                if !may_wait {
                    return self.hand_off(Batch::default());
                }
                self.checkpoint();
            }
            let mut state = lock(&self.state);
            if state.queue.is_empty() {
                self.company.store(company || round > 1, Ordering::Relaxed);
                state.writing = false;
                if state.committed == state.journal.last() {
                    state.journal.rotate();
                }
                return;
            }
            batch = take_batch(&mut state);
            drop(state);
            if !may_wait && round >= INLINE_ROUNDS {
                return self.hand_off(batch);
            }
        }
    }

    /// Takes the queue now that this caller leads.
    fn lead_queued(self: &Arc<Self>) {
        let batch = take_batch(&mut lock(&self.state));
        self.lead(batch, false);
    }

    /// The rest of a leader's work, on a blocking thread (or on this one,
    /// which may then block, outside a runtime).
    fn hand_off(self: &Arc<Self>, batch: Batch) {
        let this = Arc::clone(self);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(move || this.lead(batch, true))),
            Err(_) => this.lead(batch, true),
        }
    }

    /// Commits `batch` and tells its waiters how it went. Hands it back
    /// untouched if the write lock is taken and `may_wait` is false.
    fn write(&self, batch: Batch, may_wait: bool) -> Result<(), Batch> {
        let mut written = Ok(());
        if !batch.rows.is_empty() || batch.backlog.is_some() {
            let backlog = batch.backlog.map_or_else(Vec::new, |(after, upto)| {
                journal::read_range(&self.journal_path, after, upto)
            });
            let conn = lock(&self.conn);
            let wait = if may_wait { BUSY_WAIT } else { Duration::ZERO };
            if let Err(error) = conn.busy_timeout(wait) {
                tracing::warn!(%error, "audit connection: busy timeout not set");
            }
            written = match self.insert_all(&conn, &batch, &backlog) {
                Ok(()) => {
                    self.committed(batch.mark_to());
                    Ok(())
                }
                Err(error) if !may_wait && is_busy(&error) => return Err(batch),
                Err(error) => self.one_by_one(&conn, &batch, backlog, error),
            };
        }
        for done in batch.waiters {
            let _ = done.send(written);
        }
        Ok(())
    }

    /// One transaction; rolled back if any row fails.
    fn insert_all(
        &self,
        conn: &Connection,
        batch: &Batch,
        backlog: &[JournaledRow],
    ) -> rusqlite::Result<()> {
        // Cached like the inserts: parsing these two anew was a tenth of
        // the audit's CPU under load.
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        let written = backlog
            .iter()
            .try_for_each(|row| self.insert_journaled(conn, row))
            .and_then(|()| batch.rows.iter().try_for_each(|row| self.insert(conn, row)))
            .and_then(|()| self.mark(conn, batch.mark_to()));
        match written {
            Ok(()) => conn.prepare_cached("COMMIT")?.execute([]).map(drop),
            Err(error) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(error)
            }
        }
    }

    /// After a failed batch, each row on its own, so one bad row does not
    /// take the others with it. Still one transaction (a savepoint per
    /// row), so the journal's mark moves with exactly the rows written. If
    /// none can be written (the database refuses them all: a full disk, a
    /// read-only file, a revoked grant), nothing is committed: journaled
    /// rows stay in the journal for the next commit, and waiters hear of
    /// the failure.
    fn one_by_one(
        &self,
        conn: &Connection,
        batch: &Batch,
        backlog: Vec<JournaledRow>,
        error: rusqlite::Error,
    ) -> Result<(), AuditError> {
        if batch.rows.len() == 1 && batch.mark_to().is_none() {
            tracing::error!(%error, "audit row not recorded");
            return Err(AuditError::NotRecorded);
        }
        let rows = backlog.len() + batch.rows.len();
        tracing::warn!(%error, rows, "audit batch failed; writing its rows one by one");
        let mut all = Ok(());
        let mut written_rows = 0;
        let mut failed_in_a_row = 0;
        let mut refused = Vec::new();
        let written = (|| {
            conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
            let backlog = backlog.iter().map(Err);
            for row in backlog.chain(batch.rows.iter().map(Ok)) {
                if written_rows == 0 && failed_in_a_row >= REFUSED_ALL_AFTER {
                    break;
                }
                conn.prepare_cached("SAVEPOINT audit_row")?.execute([])?;
                let inserted = match row {
                    Ok(row) => self.insert(conn, row),
                    Err(journaled) => self.insert_journaled(conn, journaled),
                };
                if let Err(error) = inserted {
                    tracing::error!(%error, "audit row not recorded");
                    all = Err(AuditError::NotRecorded);
                    failed_in_a_row += 1;
                    refused.push(refused_row(row, &error));
                    conn.prepare_cached("ROLLBACK TO audit_row")?.execute([])?;
                } else {
                    written_rows += 1;
                }
                conn.prepare_cached("RELEASE audit_row")?.execute([])?;
            }
            if written_rows == 0 {
                // Not committed: the mark must not move past rows that are
                // in the journal only.
                return Err(rusqlite::Error::ExecuteReturnedResults);
            }
            self.mark(conn, batch.mark_to())?;
            conn.prepare_cached("COMMIT")?.execute([]).map(drop)
        })();
        match written {
            Ok(()) => {
                self.committed(batch.mark_to());
                self.keep_refused(&refused);
                all
            }
            Err(_) if written_rows == 0 => {
                let _ = conn.execute_batch("ROLLBACK");
                tracing::error!(
                    rows,
                    "the database refused every audit row; journaled ones are kept"
                );
                Err(AuditError::NotRecorded)
            }
            Err(error) => {
                let _ = conn.execute_batch("ROLLBACK");
                tracing::error!(%error, rows = batch.rows.len(), "audit rows not recorded");
                Err(AuditError::NotRecorded)
            }
        }
    }

    /// Records that the journal is committed up to `seq`.
    fn mark(&self, conn: &Connection, seq: Option<u64>) -> rusqlite::Result<()> {
        let Some(seq) = seq else {
            return Ok(());
        };
        self.store.note_statement(journal::MARK_SQL);
        let seq = i64::try_from(seq).unwrap_or(i64::MAX);
        conn.prepare_cached(journal::MARK_SQL)?
            .execute(rusqlite::params![self.journal_name, seq])?;
        Ok(())
    }

    /// Rows refused on their own while their batch committed: kept in a
    /// file beside the database (a journaled row's reply has gone, so
    /// nobody else would hear of it).
    fn keep_refused(&self, refused: &[journal::Refused]) {
        if refused.is_empty() {
            return;
        }
        let file = &self.refused_path;
        match journal::keep_refused(file, refused) {
            Ok(()) => tracing::error!(
                rows = refused.len(),
                file = %file.display(),
                "audit rows the database refused are kept in a file"
            ),
            Err(error) => tracing::error!(
                %error,
                rows = refused.len(),
                file = %file.display(),
                "audit rows the database refused could not be kept"
            ),
        }
    }

    /// A row read back from the journal.
    fn insert_journaled(&self, conn: &Connection, row: &JournaledRow) -> rusqlite::Result<()> {
        let sql = insert_sql_for(Backend::Sqlite, row.kind);
        self.store.note_statement(sql);
        conn.prepare_cached(sql)?
            .execute(rusqlite::params_from_iter(journal::sql_values(
                row.cells.clone(),
            )))?;
        Ok(())
    }

    fn insert(&self, conn: &Connection, row: &AuditRow) -> rusqlite::Result<()> {
        let sql = insert_sql(Backend::Sqlite, row);
        self.store.note_statement(sql);
        let cells =
            row_cells(row).map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))?;
        let params: Vec<&dyn ToSql> = cells.iter().map(|cell| cell as &dyn ToSql).collect();
        conn.prepare_cached(sql)?.execute(params.as_slice())?;
        Ok(())
    }

    /// Counts a commit, which carried the journal up to `mark`; every
    /// [`CHECKPOINT_EVERY`], the leader checkpoints.
    fn committed(&self, mark: Option<u64>) {
        if let Some(mark) = mark {
            let mut state = lock(&self.state);
            state.committed = state.committed.max(mark);
        }
        let commits = self.commits.fetch_add(1, Ordering::Relaxed) + 1;
        if commits.is_multiple_of(CHECKPOINT_EVERY) {
            self.checkpoint_due.store(true, Ordering::Relaxed);
        }
    }

    /// Copies the log into the database file. Passive: a reader's snapshot
    /// or another connection's write may keep it from catching up, and the
    /// next one tries again.
    fn checkpoint(&self) {
        self.checkpoint_due.store(false, Ordering::Relaxed);
        let conn = lock(&self.conn);
        let progress = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            Ok((row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
        });
        match progress {
            Ok((log, copied)) if log != copied => {
                tracing::debug!(log, copied, "audit: the checkpoint did not catch up")
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "audit: checkpoint failed"),
        }
    }
}

impl ToSql for Cell<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        match self {
            Cell::Text(text) => text.to_sql(),
            Cell::Owned(text) => text.to_sql(),
            Cell::Int(n) => n.to_sql(),
        }
    }
}

/// A caller's leadership between claiming it and writing. Dropped unused
/// (the caller's future cancelled during its yield), it hands the queue to
/// a blocking thread, so the rows and their waiters are not stranded.
struct Claim<'a>(Option<&'a Arc<SqliteLeader>>);

impl Claim<'_> {
    fn lead(mut self) {
        if let Some(this) = self.0.take() {
            this.lead_queued();
        }
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if let Some(this) = self.0.take() {
            this.hand_off(take_batch(&mut lock(&this.state)));
        }
    }
}

/// Appends the queued rows not yet in the journal (the new row last) to it.
/// False if the journal is full or the write failed: the row is then
/// committed before its caller goes on.
fn append_journal(state: &mut State) -> bool {
    let State {
        queue,
        journal,
        journaled,
        ..
    } = state;
    if journal.is_full() {
        return false;
    }
    let mut lines = Vec::with_capacity(queue.len() - *journaled);
    for row in queue[*journaled..].iter().filter_map(|p| p.row.as_ref()) {
        match row_cells(row) {
            Ok(cells) => lines.push((row.kind(), cells)),
            Err(_) => return false,
        }
    }
    match journal.append(lines.into_iter()) {
        Ok(()) => {
            *journaled = queue.len();
            true
        }
        Err(error) => {
            tracing::warn!(%error, "audit journal: write failed; committing instead");
            false
        }
    }
}

impl Drop for SqliteLeader {
    /// Every row committed: the journal is done with. Rows still queued
    /// leave it for the next opener to write.
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if !state.queue.is_empty() || state.committed < state.taken {
            return;
        }
        let conn = self.conn.get_mut().unwrap_or_else(|p| p.into_inner());
        state.journal.retire(conn);
    }
}

fn take_batch(state: &mut State) -> Batch {
    let backlog = (state.committed < state.taken).then_some((state.committed, state.taken));
    let journaled_to = (state.journaled > 0).then(|| state.journal.last());
    if let Some(last) = journaled_to {
        state.taken = last;
    }
    state.journaled = 0;
    let mut rows = Vec::with_capacity(state.queue.len());
    let mut waiters = Vec::with_capacity(state.queue.len());
    for pending in state.queue.drain(..) {
        rows.extend(pending.row);
        waiters.extend(pending.done);
    }
    Batch {
        rows: fold_access_failures(rows),
        waiters,
        journaled_to,
        backlog,
    }
}

fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// A panic while holding the lock leaves nothing half-done here that a
/// later caller could not carry on from.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A refused row as [`journal::keep_refused`] writes it.
fn refused_row(row: Result<&AuditRow, &JournaledRow>, error: &rusqlite::Error) -> journal::Refused {
    let (kind, cells) = match row {
        Ok(row) => (
            row.kind(),
            row_cells(row).map_or(serde_json::Value::Null, |cells| {
                journal::cells_value(&cells)
            }),
        ),
        Err(journaled) => (
            journaled.kind,
            serde_json::Value::from(journaled.cells.clone()),
        ),
    };
    journal::Refused {
        kind,
        cells,
        error: error.to_string(),
    }
}
