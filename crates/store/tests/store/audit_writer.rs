//! The audit writer under contention: many callers at once, and a database
//! whose write lock another connection holds.

use std::time::{Duration, Instant};

use manifold_store::{
    AuditCommit, AuditKind, AuditRow, AuditWriter, Backend, CallOutcome, Decision, hash_arguments,
};
use manifold_test_postgres::{TestDatabase, on_both_backends};
use serde_json::json;

use crate::{T0, open};

on_both_backends!(every_committed_row_is_there_when_its_caller_returns);

pub(crate) fn row(i: i64) -> AuditRow {
    AuditRow::Activity(manifold_store::ActivityEvent {
        at: T0 + i,
        principal: format!("p-{i}"),
        token_id: None,
        tool: "files__read".into(),
        args_hash: hash_arguments(&json!({ "i": i })),
        decision: Decision::Allowed,
        approval_id: None,
        outcome: CallOutcome::Success,
        latency_ms: 1,
        bytes_in: 2,
        bytes_out: 3,
        details: json!({}),
    })
}

/// Runs `body` on a runtime of its own: one thread, or a pool of `threads`.
fn on_threads(threads: usize, body: impl std::future::Future<Output = ()>) {
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(threads);
        builder
    };
    builder.enable_all().build().unwrap().block_on(body);
}

/// A connection of the test's own to its SQLite file.
fn connect(db: &TestDatabase) -> rusqlite::Connection {
    let path = db.url().trim_start_matches("sqlite://");
    rusqlite::Connection::open(path.split('?').next().unwrap()).unwrap()
}

/// Another connection to the test's SQLite file, holding its write lock
/// until the caller commits.
fn hold_write_lock(db: &TestDatabase) -> rusqlite::Connection {
    let blocker = connect(db);
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    blocker
}

async fn activity_rows(store: &manifold_store::Store) -> usize {
    store
        .audit_export(AuditKind::Activity, 0)
        .await
        .unwrap()
        .len()
}

/// 64 callers at once: each call returns only once its own row is
/// committed, whoever led the commit.
async fn every_committed_row_is_there_when_its_caller_returns(db: TestDatabase) {
    let store = open(&db).await;
    let writer = AuditWriter::start(store.clone(), AuditCommit::Sync);
    let calls: Vec<_> = (0..64)
        .map(|i| {
            let (writer, store) = (writer.clone(), store.clone());
            tokio::spawn(async move {
                writer.record(row(i)).await.unwrap();
                // This caller's row is readable now, from another connection.
                let rows = store.audit_export(AuditKind::Activity, 0).await.unwrap();
                assert!(
                    rows.iter()
                        .any(|r| r["principal"] == json!(format!("p-{i}"))),
                    "row {i} not committed when record returned"
                );
            })
        })
        .collect();
    for call in calls {
        call.await.unwrap();
    }
    assert_eq!(activity_rows(&store).await, 64);
}

/// The same on two threads, where leaders and followers really overlap.
#[test]
fn every_committed_row_is_there_on_two_threads() {
    on_threads(2, async {
        let db = TestDatabase::new(Backend::Sqlite).await;
        every_committed_row_is_there_when_its_caller_returns(db).await;
    });
}

#[test]
fn a_sqlite_file_commits_on_the_callers_thread_and_memory_uses_the_task() {
    on_threads(1, async {
        let db = TestDatabase::new(Backend::Sqlite).await;
        let writer = AuditWriter::start(db.store().await, AuditCommit::Sync);
        assert!(
            format!("{writer:?}").contains("sqlite leader"),
            "{writer:?}"
        );
        let memory = manifold_store::Store::connect("sqlite::memory:")
            .await
            .unwrap();
        let writer = AuditWriter::start(memory, AuditCommit::Sync);
        assert!(format!("{writer:?}").contains("task"), "{writer:?}");
    });
}

/// Where no journal can be made beside the database, the task writes the
/// rows, and a sync row is committed when its caller goes on.
#[test]
fn without_a_journal_a_sqlite_file_uses_the_task() {
    on_threads(1, async {
        let db = TestDatabase::new(Backend::Sqlite).await;
        let store = db.store().await;
        // A file where the journal's directory would go.
        std::fs::write(journal_dir(&db), b"").unwrap();
        let writer = AuditWriter::start(store.clone(), AuditCommit::Sync);
        assert!(format!("{writer:?}").contains("task"), "{writer:?}");
        writer.record(row(0)).await.unwrap();
        assert_eq!(rows_in(&db, "activity_audit"), 1);
    });
}

/// Another connection holds SQLite's write lock: the leader waits for it off
/// the runtime's threads (a single-threaded runtime keeps running other
/// tasks meanwhile), and a caller waiting for the commit (a flush) returns
/// once the lock is released and the rows are in.
#[test]
fn a_held_write_lock_delays_the_row_but_not_the_runtime() {
    on_threads(1, async {
        let db = TestDatabase::new(Backend::Sqlite).await;
        let store = db.store().await;
        let writer = AuditWriter::start(store.clone(), AuditCommit::Sync);
        writer.record(row(0)).await.unwrap();
        writer.flush().await.unwrap();

        let blocker = hold_write_lock(&db);

        let started = Instant::now();
        writer.record(row(1)).await.unwrap();
        let call = tokio::spawn({
            let writer = writer.clone();
            async move { writer.flush().await }
        });
        // The runtime's one thread is free: this timer fires on time.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "the runtime was blocked: {:?}",
            started.elapsed()
        );
        assert!(!call.is_finished(), "committed while the lock was held");
        assert_eq!(rows_in(&db, "activity_audit"), 1);
        blocker.execute_batch("COMMIT").unwrap();
        tokio::time::timeout(Duration::from_secs(5), call)
            .await
            .expect("the row is committed once the lock is free")
            .unwrap()
            .unwrap();
        assert_eq!(activity_rows(&store).await, 2);
    });
}

/// Rows nobody waits for are committed within the linger without a flush.
#[test]
fn queued_rows_are_committed_within_the_linger() {
    on_threads(2, async {
        let db = TestDatabase::new(Backend::Sqlite).await;
        let store = db.store().await;
        let writer = AuditWriter::start(store.clone(), AuditCommit::Async);
        for i in 0..10 {
            writer.record(row(i)).await.unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while activity_rows(&store).await < 10 {
            assert!(Instant::now() < deadline, "queued rows never committed");
            tokio::time::sleep(manifold_store::LINGER).await;
        }
    });
}

/// While another connection holds the write lock, queued rows pile up only
/// to `QUEUE_CAPACITY`; the next caller waits for the commit, and nothing
/// is lost once the lock is free.
#[test]
fn a_full_queue_makes_callers_wait() {
    on_threads(2, async {
        let db = TestDatabase::new(Backend::Sqlite).await;
        let store = db.store().await;
        let writer = AuditWriter::start(store.clone(), AuditCommit::Async);
        let blocker = hold_write_lock(&db);

        // The first row's linger ends and its leader waits for the lock.
        writer.record(row(0)).await.unwrap();
        tokio::time::sleep(manifold_store::LINGER * 10).await;
        let capacity = manifold_store::QUEUE_CAPACITY as i64;
        for i in 1..=capacity {
            writer.record(row(i)).await.unwrap();
        }
        let over = tokio::spawn({
            let writer = writer.clone();
            async move { writer.record(row(capacity + 1)).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!over.is_finished(), "a full queue took one more row");
        blocker.execute_batch("COMMIT").unwrap();
        tokio::time::timeout(Duration::from_secs(10), over)
            .await
            .expect("the waiting caller's row is committed once the lock is free")
            .unwrap()
            .unwrap();
        writer.flush().await.unwrap();
        assert_eq!(activity_rows(&store).await, capacity as usize + 2);
    });
}

type Written = Result<(), manifold_store::AuditError>;

/// Polls `flush` once: whether it is still pending.
async fn pending_after_one_poll(flush: impl std::future::Future<Output = Written>) -> bool {
    first_poll(std::pin::pin!(flush)).await.is_pending()
}

/// Whether `flush` was still pending after its first poll; it is then
/// driven to the end (dropped, a leader would hand off instead).
async fn waited(flush: impl std::future::Future<Output = Written>) -> bool {
    let mut flush = std::pin::pin!(flush);
    let pending = first_poll(flush.as_mut()).await.is_pending();
    if pending {
        flush.await.unwrap();
    }
    pending
}

async fn first_poll<F: std::future::Future<Output = Written>>(
    mut flush: std::pin::Pin<&mut F>,
) -> std::task::Poll<Written> {
    std::future::poll_fn(|cx| std::task::Poll::Ready(flush.as_mut().poll(cx))).await
}

/// Under load a leader yields before it writes; a caller dropped right
/// there (its request cancelled) hands the queue on instead of leaving it,
/// and the writer keeps taking rows. A caller alone never yields. (A sync
/// row goes to the journal and returns; the callers that lead and wait for
/// the commit are flushes.)
#[test]
fn a_leader_dropped_before_it_writes_strands_nothing() {
    on_threads(1, async {
        let db = TestDatabase::new(Backend::Sqlite).await;
        let store = db.store().await;
        let writer = AuditWriter::start(store.clone(), AuditCommit::Sync);
        // Alone: committed within its first poll.
        writer.record(row(0)).await.unwrap();
        assert!(!pending_after_one_poll(writer.flush()).await);
        assert_eq!(rows_in(&db, "activity_audit"), 1);
        // Load: while a held write lock keeps the leader waiting, a second
        // caller queues behind it, so the leader writes two rounds and the
        // next leader expects company.
        let blocker = hold_write_lock(&db);
        let mut held = Vec::new();
        for i in 1..=2 {
            let writer = writer.clone();
            held.push(tokio::spawn(async move {
                writer.record(row(i)).await.unwrap();
                writer.flush().await
            }));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        blocker.execute_batch("COMMIT").unwrap();
        for call in held {
            call.await.unwrap().unwrap();
        }
        // Polled once (it claims the lead and yields), then dropped.
        writer.record(row(3)).await.unwrap();
        assert!(
            pending_after_one_poll(writer.flush()).await,
            "the leader did not yield before writing"
        );
        writer.record(row(4)).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), writer.flush())
            .await
            .expect("the next caller is not stranded behind the dropped leader")
            .unwrap();
        assert_eq!(activity_rows(&store).await, 5);
    });
}

/// Rows written without a pause still let the log restart: the writer
/// checkpoints as the leader, so no other audit commit lands meanwhile and
/// the checkpoint catches up. Under sustained calls the log grew by every
/// commit's pages (135 MB in 14 s of `bench call`).
#[test]
fn the_log_stays_bounded_under_continuous_writes() {
    on_threads(2, async {
        let db = TestDatabase::new(Backend::Sqlite).await;
        let store = db.store().await;
        let writer = AuditWriter::start(store.clone(), AuditCommit::Sync);
        let path = db.url().trim_start_matches("sqlite://");
        let wal = format!("{}-wal", path.split('?').next().unwrap());
        let callers: Vec<_> = (0..4)
            .map(|c| {
                let writer = writer.clone();
                tokio::spawn(async move {
                    for i in 0..500 {
                        writer.record(row(c * 1000 + i)).await.unwrap();
                    }
                })
            })
            .collect();
        for caller in callers {
            caller.await.unwrap();
        }
        writer.flush().await.unwrap();
        assert_eq!(activity_rows(&store).await, 2000);
        let size = std::fs::metadata(&wal).map_or(0, |m| m.len());
        // 2,000 commits of up to four pages each would be 32 MB; the
        // checkpoint every 256 commits keeps it near 256 commits' worth.
        assert!(size < 8 << 20, "the log grew to {size} bytes");
    });
}

/// The load signal: a leader yields before it writes when another call's
/// row is on its way, so that row can join its commit; with only its own
/// call coming it commits within its first poll.
#[test]
fn a_leader_yields_only_while_other_rows_are_coming() {
    on_threads(1, async {
        let db = TestDatabase::new(Backend::Sqlite).await;
        let store = db.store().await;
        let writer = AuditWriter::start(store.clone(), AuditCommit::Sync);
        let mine = writer.begin_call().unwrap();
        writer.record(row(0)).await.unwrap();
        assert!(!waited(writer.flush()).await);
        let other = writer.begin_call().unwrap();
        writer.record(row(1)).await.unwrap();
        assert!(
            waited(writer.flush()).await,
            "the leader did not wait for the row on its way"
        );
        drop(other);
        writer.record(row(2)).await.unwrap();
        assert!(!waited(writer.flush()).await);
        drop(mine);
        assert_eq!(activity_rows(&store).await, 3);
    });
}

/// Rows in `table`, read by a connection of the test's own (no await, so
/// nothing else on this thread runs meanwhile).
fn rows_in(db: &TestDatabase, table: &str) -> i64 {
    connect(db)
        .query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
            row.get(0)
        })
        .unwrap()
}

/// A successful access row, as a request with a token begins with it.
fn access() -> manifold_store::AccessEvent {
    manifold_store::AccessEvent::success(T0, "token:bench", None)
}

/// A request's access row lingers from the end of the request, not from
/// when it was queued: no timer fires for it while the request runs (its
/// own activity row would take it along), and once the request ends
/// without such a row it is committed within the linger.
#[test]
fn a_requests_access_row_lingers_from_the_end_of_the_request() {
    on_threads(2, async {
        let db = TestDatabase::new(Backend::Sqlite).await;
        let store = db.store().await;
        let writer = AuditWriter::start(store.clone(), AuditCommit::Sync);

        let request = writer.begin_request(access()).await.unwrap();
        tokio::time::sleep(manifold_store::LINGER * 4).await;
        assert_eq!(
            rows_in(&db, "access_audit"),
            0,
            "still queued while the request runs"
        );
        drop(request);
        let deadline = Instant::now() + Duration::from_secs(5);
        while rows_in(&db, "access_audit") == 0 {
            assert!(
                Instant::now() < deadline,
                "never committed after the request ended"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }

        // A request with a row of its own journals its access row with it
        // and commits it in the same transaction.
        let request = writer.begin_request(access()).await.unwrap();
        writer.record(row(1)).await.unwrap();
        assert_eq!(
            journal_lines(&db).len(),
            2,
            "journaled with the activity row"
        );
        committed_within_the_linger(&db, "activity_audit", 1).await;
        assert_eq!(
            rows_in(&db, "access_audit"),
            2,
            "committed with the activity row"
        );
        drop(request);
        writer.flush().await.unwrap();
        assert_eq!(rows_in(&db, "access_audit"), 2);
        drop(store);
    });
}

/// The journal next to the test's SQLite file.
fn journal_dir(db: &TestDatabase) -> std::path::PathBuf {
    let path = db.url().trim_start_matches("sqlite://");
    format!("{}.audit-journal", path.split('?').next().unwrap()).into()
}

fn refused_file(db: &TestDatabase) -> std::path::PathBuf {
    let path = db.url().trim_start_matches("sqlite://");
    format!("{}.audit-refused.jsonl", path.split('?').next().unwrap()).into()
}

fn journal_lines(db: &TestDatabase) -> Vec<String> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(journal_dir(db)).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        lines.extend(text.lines().map(str::to_string));
    }
    lines
}

/// A sync row is durable in the journal when its caller goes on, and is
/// committed within the linger, with the rows of other calls meanwhile.
/// Readers in the process do not wait for that.
#[test]
fn a_sync_row_is_journaled_then_committed_right_after() {
    on_threads(1, async {
        let db = TestDatabase::new(Backend::Sqlite).await;
        let store = db.store().await;
        let writer = AuditWriter::start(store.clone(), AuditCommit::Sync);
        writer.record(row(0)).await.unwrap();
        let lines = journal_lines(&db);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("\"seq\":1") && lines[0].contains("p-0"));
        writer.record(row(1)).await.unwrap();
        assert_eq!(journal_lines(&db).len(), 2);
        assert_eq!(rows_in(&db, "activity_audit"), 0, "not committed yet");
        committed_within_the_linger(&db, "activity_audit", 2).await;
        let mark: i64 = connect(&db)
            .query_row("SELECT applied FROM audit_journal", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mark, 2, "the commit records how far the journal is done");

        // An in-process reader does not wait for the linger.
        writer.record(row(2)).await.unwrap();
        assert_eq!(activity_rows(&store).await, 3);
    });
}

/// Another process (here: a store of its own on the same file) reads the
/// rows a running writer has journaled but not committed, once each, and
/// still once each after they are committed.
#[test]
fn another_process_reads_journaled_rows_before_their_commit() {
    on_threads(1, async {
        let db = TestDatabase::new(Backend::Sqlite).await;
        let store = db.store().await;
        let writer = AuditWriter::start(store.clone(), AuditCommit::Sync);
        writer.record(row(0)).await.unwrap();
        committed_within_the_linger(&db, "activity_audit", 1).await;
        let reader = db.store().await;
        // The commit cannot happen while another connection writes.
        let blocker = hold_write_lock(&db);
        writer.record(row(1)).await.unwrap();
        writer.record(row(2)).await.unwrap();
        assert_eq!(rows_in(&db, "activity_audit"), 1, "not committed yet");
        let principals = |rows: Vec<serde_json::Value>| -> Vec<String> {
            rows.iter()
                .map(|r| r["principal"].as_str().unwrap().to_string())
                .collect()
        };
        let seen = reader.audit_export(AuditKind::Activity, 0).await.unwrap();
        assert_eq!(principals(seen.clone()), ["p-0", "p-1", "p-2"], "{seen:?}");
        assert!(seen[2]["id"].is_null(), "not committed: {seen:?}");
        let tail = reader.audit_tail(AuditKind::Activity, 2).await.unwrap();
        assert_eq!(principals(tail), ["p-1", "p-2"]);
        assert!(
            reader
                .audit_export(AuditKind::Access, 0)
                .await
                .unwrap()
                .is_empty(),
            "only the trail asked for"
        );
        blocker.execute_batch("COMMIT").unwrap();
        committed_within_the_linger(&db, "activity_audit", 3).await;
        let seen = reader.audit_export(AuditKind::Activity, 0).await.unwrap();
        assert_eq!(principals(seen.clone()), ["p-0", "p-1", "p-2"]);
        assert!(seen.iter().all(|r| r["id"].is_i64()), "{seen:?}");
    });
}

/// The journal of a process that died before committing: the next opener
/// writes the rows beyond its mark, once, and deletes it. A journal whose
/// owner still holds it is left alone.
#[test]
fn a_stopped_processs_journal_is_written_once_by_the_next_opener() {
    on_threads(1, async {
        let db = TestDatabase::new(Backend::Sqlite).await;
        drop(db.store().await);
        let dir = journal_dir(&db);
        std::fs::create_dir_all(&dir).unwrap();
        let line = |seq: i64| {
            json!({"seq": seq, "kind": "activity", "cells": [
                null, T0 + seq, format!("p-{seq}"), "files__read", "h", "allowed", null,
                "success", 1, 2, 3, "{}"]})
            .to_string()
        };
        let orphan = dir.join("1-dead.jsonl");
        // Committed up to 1 before it died; the last line was cut short.
        let text = format!("{}\n{}\n{}\n{{\"seq\":4,\"ki", line(1), line(2), line(3));
        std::fs::write(&orphan, text).unwrap();
        connect(&db)
            .execute("INSERT INTO audit_journal VALUES ('1-dead.jsonl', 1)", [])
            .unwrap();

        // Held by a live owner: not touched.
        let held = std::fs::File::open(&orphan).unwrap();
        held.lock().unwrap();
        drop(db.store().await);
        assert!(orphan.exists());
        assert_eq!(rows_in(&db, "activity_audit"), 0);
        drop(held);

        let store = db.store().await;
        assert!(!orphan.exists(), "the journal is deleted once written");
        let rows = store.audit_export(AuditKind::Activity, 0).await.unwrap();
        let principals: Vec<_> = rows.iter().map(|r| r["principal"].clone()).collect();
        assert_eq!(principals, vec![json!("p-2"), json!("p-3")]);
        assert_eq!(rows_in(&db, "audit_journal"), 0, "its mark is gone");
        drop(store);
        drop(db.store().await);
        assert_eq!(rows_in(&db, "activity_audit"), 2, "written once");
    });
}

/// A lone call's access row is not committed while it waits on its
/// upstream: it goes to the journal with the call's activity row, in one
/// write, and into one commit after the reply.
#[test]
fn with_a_journal_the_access_row_joins_the_calls_row() {
    on_threads(1, async {
        let db = TestDatabase::new(Backend::Sqlite).await;
        let store = db.store().await;
        let writer = AuditWriter::start(store.clone(), AuditCommit::Sync);
        let request = writer.begin_request(access()).await.unwrap();
        let _mine = writer.begin_call().unwrap();
        // The upstream at work.
        tokio::time::sleep(manifold_store::LINGER * 4).await;
        assert_eq!(
            rows_in(&db, "access_audit"),
            0,
            "not committed while waiting"
        );
        writer.record(row(0)).await.unwrap();
        drop(request);
        assert_eq!(journal_lines(&db).len(), 2);
        committed_within_the_linger(&db, "activity_audit", 1).await;
        assert_eq!(rows_in(&db, "access_audit"), 1, "in the same commit");
    });
}

/// Waits (a few lingers at most) for `table` to hold `n` rows.
async fn committed_within_the_linger(db: &TestDatabase, table: &str, n: i64) {
    let started = Instant::now();
    while rows_in(db, table) < n {
        assert!(
            started.elapsed() < manifold_store::LINGER * 100,
            "not committed: {} of {n} rows in {table}",
            rows_in(db, table)
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(rows_in(db, table), n);
}

/// A journal that cannot be emptied (its rows cannot be committed) stops
/// taking rows at 16 MiB: the next caller waits for its commit, as without
/// a journal, and once the rows are in the journal is emptied.
#[test]
fn a_journal_that_cannot_be_emptied_stops_growing() {
    on_threads(2, async {
        let db = TestDatabase::new(Backend::Sqlite).await;
        let store = db.store().await;
        let writer = AuditWriter::start(store.clone(), AuditCommit::Sync);
        let big = |i: i64| {
            let AuditRow::Activity(mut event) = row(i) else {
                unreachable!()
            };
            event.details = json!({ "blob": "x".repeat(1 << 20) });
            AuditRow::Activity(event)
        };
        let blocker = hold_write_lock(&db);
        for i in 0..16 {
            writer.record(big(i)).await.unwrap();
        }
        let journal_bytes = || -> u64 {
            std::fs::read_dir(journal_dir(&db))
                .unwrap()
                .map(|e| e.unwrap().metadata().unwrap().len())
                .sum()
        };
        assert!(journal_bytes() >= 16 << 20);
        let call = tokio::spawn({
            let writer = writer.clone();
            async move { writer.record(row(99)).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!call.is_finished(), "a full journal took another row");
        assert!(journal_bytes() < 17 << 20);
        blocker.execute_batch("COMMIT").unwrap();
        tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("committed once the lock is free")
            .unwrap()
            .unwrap();
        assert_eq!(rows_in(&db, "activity_audit"), 17);
        // The leader empties it as it steps down, just after telling its
        // waiters their rows are in.
        let started = Instant::now();
        while journal_bytes() != 0 {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "not emptied once everything is committed: {} bytes",
                journal_bytes()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
}

/// While the database refuses every row (the fault here: a trigger), rows
/// go on being journaled until the journal is full; then a row cannot be
/// made durable and its caller hears so. Once the database takes rows
/// again, the next commit carries every journaled row too: each row whose
/// caller was told it was durable is committed, the journal is emptied.
#[test]
fn journaled_rows_outlive_a_database_that_refuses_them() {
    on_threads(2, async {
        let db = TestDatabase::new(Backend::Sqlite).await;
        let store = db.store().await;
        let writer = AuditWriter::start(store.clone(), AuditCommit::Sync);
        let big = |i: i64| {
            let AuditRow::Activity(mut event) = row(i) else {
                unreachable!()
            };
            event.details = json!({ "blob": "x".repeat(1 << 20) });
            AuditRow::Activity(event)
        };
        connect(&db)
            .execute_batch(
                "CREATE TRIGGER fault BEFORE INSERT ON activity_audit \
                 BEGIN SELECT RAISE(ABORT, 'fault'); END;",
            )
            .unwrap();
        for i in 0..16 {
            writer.record(big(i)).await.expect("journaled");
        }
        let refused = tokio::time::timeout(Duration::from_secs(10), writer.record(row(99)))
            .await
            .expect("answered");
        assert!(
            refused.is_err(),
            "a full journal is not durable: {refused:?}"
        );
        assert_eq!(rows_in(&db, "activity_audit"), 0);

        connect(&db).execute_batch("DROP TRIGGER fault").unwrap();
        tokio::time::timeout(Duration::from_secs(10), writer.record(row(100)))
            .await
            .expect("answered")
            .expect("durable again");
        committed_within_the_linger(&db, "activity_audit", 17).await;
        let principals: Vec<String> = store
            .audit_export(AuditKind::Activity, 0)
            .await
            .unwrap()
            .iter()
            .map(|r| r["principal"].as_str().unwrap().to_string())
            .collect();
        assert!(!principals.contains(&"p-99".to_string()), "{principals:?}");
        assert!(principals.contains(&"p-100".to_string()));
        assert!(principals.contains(&"p-15".to_string()));
    });
}

/// A row the database refuses does not take the rows committed with it
/// along, and the journal's mark still moves past all of them, so a replay
/// after a crash would not write the good ones again. The refused row is not
/// lost: it is kept, with the database's reason, in a file beside it.
#[test]
fn a_refused_row_leaves_its_batch_written_and_the_journal_marked() {
    on_threads(1, async {
        let db = TestDatabase::new(Backend::Sqlite).await;
        let store = db.store().await;
        connect(&db)
            .execute_batch(
                "CREATE TRIGGER refuse_bad BEFORE INSERT ON activity_audit \
                 WHEN NEW.principal = 'p-1' BEGIN SELECT RAISE(ABORT, 'refused'); END;",
            )
            .unwrap();
        let writer = AuditWriter::start(store.clone(), AuditCommit::Sync);
        for i in 0..3 {
            writer.record(row(i)).await.unwrap();
        }
        assert_eq!(journal_lines(&db).len(), 3);
        assert_eq!(
            writer.flush().await,
            Err(manifold_store::AuditError::NotRecorded),
            "the flush hears that a row was refused"
        );
        let rows = store.audit_export(AuditKind::Activity, 0).await.unwrap();
        let principals: Vec<_> = rows.iter().map(|r| r["principal"].clone()).collect();
        assert_eq!(principals, vec![json!("p-0"), json!("p-2")]);
        let mark: i64 = connect(&db)
            .query_row("SELECT applied FROM audit_journal", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mark, 3);
        let kept = std::fs::read_to_string(refused_file(&db)).expect("refused rows kept");
        let lines: Vec<serde_json::Value> = kept
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 1, "{kept}");
        assert_eq!(lines[0]["kind"], "activity");
        assert!(lines[0]["error"].as_str().unwrap().contains("refused"));
        assert!(
            lines[0]["cells"]
                .as_array()
                .unwrap()
                .contains(&json!("p-1")),
            "{kept}"
        );
    });
}
