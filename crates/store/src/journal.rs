//! The audit journal: how a SQLite gateway replies before its audit row is
//! in the database without being able to lose it.
//!
//! With `audit_commit = "sync"` a reply waits for its row to be durable.
//! Committing it to SQLite on the reply's path costs a transaction per
//! lone call (locks, two WAL pages, tens of microseconds). Instead the
//! caller appends the row to this process's journal, one `write`, and the
//! SQLite leader (`sqlite_leader.rs`) commits it with others right after.
//! The journal lives beside the database file, in `<db>.audit-journal/`,
//! so it shares the database's durability: a `write` survives the process
//! (a crash, a SIGKILL) and, like a WAL commit at `synchronous = NORMAL`,
//! not a power cut.
//!
//! Each line is one row with a sequence number. The transaction that
//! commits rows from the journal also stores, in `audit_journal`, the last
//! sequence number it carries, so a row is never written twice. The owner
//! holds an exclusive lock on its file while it runs; a file nobody holds
//! belongs to a process that is gone, and whoever opens the database next
//! (a gateway, the CLI) writes what that journal holds beyond its mark,
//! then deletes both. A live process's journal is left alone by openers;
//! readers of the audit in other processes read it beside the database
//! (`audit_read.rs`), so a row is visible once its reply has gone.

use std::{
    fs::{File, OpenOptions},
    io::{BufRead, BufReader, Write},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use rusqlite::{Connection, params_from_iter, types::Value as SqlValue};
use serde::ser::{Serialize, SerializeSeq, Serializer};
use serde_json::Value;

use crate::{
    AuditKind, Backend,
    audit::{Cell, insert_sql_for},
};

/// A journal is emptied once everything in it is committed and it has grown
/// past this.
const ROTATE_BYTES: u64 = 1 << 20;
/// A journal this large takes no more rows until it is emptied: callers
/// then wait for their commit, the queue drains, and the leader empties it.
/// Under sustained calls a leader finds the queue empty often enough that
/// the file stays near [`ROTATE_BYTES`] (measured: under 1.1 MB through 25 s
/// of 16 callers); this bounds a writer that never catches up.
const FULL_BYTES: u64 = 16 * ROTATE_BYTES;

/// The directory of the journals of the database at `db`.
fn dir_of(db: &Path) -> PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(".audit-journal");
    db.with_file_name(name)
}

/// This process's journal: an append-only file it holds locked.
pub(crate) struct Journal {
    file: File,
    path: PathBuf,
    /// Its file name, the key of its mark in `audit_journal`.
    name: String,
    /// Bytes written since it was last emptied.
    bytes: u64,
    /// The sequence number of the last row appended.
    last: u64,
    /// Lines being built, kept to reuse the allocation.
    buffer: Vec<u8>,
}

impl Journal {
    /// Creates a journal of its own for this process next to `db`.
    pub(crate) fn create(db: &Path) -> std::io::Result<Journal> {
        let dir = dir_of(db);
        std::fs::create_dir_all(&dir)?;
        let name = format!("{}-{}.jsonl", std::process::id(), crate::random_id::<8>(""));
        let path = dir.join(&name);
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .read(true)
            .open(&path)?;
        file.try_lock().map_err(std::io::Error::other)?;
        Ok(Journal {
            file,
            path,
            name,
            bytes: 0,
            last: 0,
            buffer: Vec::with_capacity(1024),
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn last(&self) -> u64 {
        self.last
    }

    /// See [`FULL_BYTES`].
    pub(crate) fn is_full(&self) -> bool {
        self.bytes >= FULL_BYTES
    }

    /// Appends `rows` as one write. On failure nothing is appended (a
    /// partial write is cut off) and the caller commits them the slow way.
    pub(crate) fn append<'a>(
        &mut self,
        rows: impl Iterator<Item = (AuditKind, Vec<Cell<'a>>)>,
    ) -> std::io::Result<()> {
        self.buffer.clear();
        let mut last = self.last;
        for (kind, cells) in rows {
            last += 1;
            let line = Line {
                seq: last,
                kind: kind.as_str(),
                cells: Cells(&cells),
            };
            serde_json::to_writer(&mut self.buffer, &line)?;
            self.buffer.push(b'\n');
        }
        if let Err(error) = self.file.write_all(&self.buffer) {
            let _ = self.file.set_len(self.bytes);
            return Err(error);
        }
        self.bytes += self.buffer.len() as u64;
        self.last = last;
        Ok(())
    }

    /// Empties the file once it is large; only when every row in it is
    /// committed (sequence numbers go on from where they were).
    pub(crate) fn rotate(&mut self) {
        if self.bytes < ROTATE_BYTES {
            return;
        }
        match self.file.set_len(0) {
            Ok(()) => self.bytes = 0,
            Err(error) => tracing::warn!(%error, "audit journal: not emptied"),
        }
    }

    /// Ends a journal whose rows are all committed: its mark and its file go.
    pub(crate) fn retire(&self, conn: &Connection) {
        if let Err(error) = conn.execute("DELETE FROM audit_journal WHERE name = ?1", [&self.name])
        {
            tracing::warn!(%error, "audit journal: mark not deleted");
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Where rows the database refused one by one are kept: beside the
/// database, `<db>.audit-refused.jsonl`, outside the journal directory so
/// no opener takes it for a journal.
pub(crate) fn refused_path(db: &Path) -> PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(".audit-refused.jsonl");
    db.with_file_name(name)
}

/// A row the database refused on its own, with why.
pub(crate) struct Refused {
    pub(crate) kind: AuditKind,
    pub(crate) cells: Value,
    pub(crate) error: String,
}

/// The cells of a row as a journal line holds them.
pub(crate) fn cells_value(cells: &[Cell<'_>]) -> Value {
    serde_json::to_value(Cells(cells)).unwrap_or(Value::Null)
}

/// Appends refused rows to `path` ([`refused_path`]), one JSON line each
/// (`{"kind", "cells", "error"}`, cells in [`insert_sql_for`]'s order), so
/// that a row the database would not take is kept for the operator rather
/// than dropped when its batch commits without it.
pub(crate) fn keep_refused(path: &Path, rows: &[Refused]) -> std::io::Result<()> {
    let mut text = Vec::new();
    for row in rows {
        let line = serde_json::json!({
            "kind": row.kind.as_str(),
            "cells": row.cells,
            "error": row.error,
        });
        serde_json::to_writer(&mut text, &line)?;
        text.push(b'\n');
    }
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(&text)
}

/// The statement that records how far a journal is committed, in the same
/// transaction as the rows.
pub(crate) const MARK_SQL: &str = "INSERT INTO audit_journal (name, applied) VALUES (?1, ?2) \
     ON CONFLICT (name) DO UPDATE SET applied = excluded.applied";

#[derive(serde::Serialize)]
struct Line<'a, 'c> {
    seq: u64,
    kind: &'static str,
    cells: Cells<'a, 'c>,
}

struct Cells<'a, 'c>(&'a [Cell<'c>]);

impl Serialize for Cells<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for cell in self.0 {
            match cell {
                Cell::Text(text) => seq.serialize_element(text)?,
                Cell::Owned(text) => seq.serialize_element(text)?,
                Cell::Int(n) => seq.serialize_element(n)?,
            }
        }
        seq.end()
    }
}

#[derive(serde::Deserialize)]
struct ReadLine {
    seq: u64,
    kind: String,
    cells: Vec<Value>,
}

/// A row as a journal holds it: its cells in [`insert_sql_for`]'s order.
pub(crate) struct JournaledRow {
    pub(crate) seq: u64,
    pub(crate) kind: AuditKind,
    pub(crate) cells: Vec<Value>,
}

/// The rows of `file`, in order. A line that cannot be read is skipped: a
/// line cut short can only be the last, whose write never returned, so no
/// reply went out for it.
fn read_rows(name: &str, file: &File) -> Vec<JournaledRow> {
    let mut rows = Vec::new();
    for line in BufReader::new(file).lines() {
        let Ok(line) = line else { break };
        let Ok(line) = serde_json::from_str::<ReadLine>(&line) else {
            tracing::debug!(journal = name, "audit journal: an unreadable line skipped");
            continue;
        };
        let Ok(kind) = line.kind.parse::<AuditKind>() else {
            tracing::warn!(
                journal = name,
                kind = line.kind,
                "audit journal: unknown kind"
            );
            continue;
        };
        rows.push(JournaledRow {
            seq: line.seq,
            kind,
            cells: line.cells,
        });
    }
    rows
}

/// The rows of the journals beside `db` whose owners are running, by
/// journal name: rows whose replies may have gone before their commit. A
/// journal nobody holds is left to the next opener, which writes it.
pub(crate) fn read_live(db: &Path) -> Vec<(String, Vec<JournaledRow>)> {
    let Ok(entries) = std::fs::read_dir(dir_of(db)) else {
        return Vec::new();
    };
    let mut live = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|ext| ext != "jsonl") {
            continue;
        }
        let Ok(file) = File::open(&path) else {
            continue;
        };
        // Our own process's journal is held through another open file, so
        // it counts as held here too.
        if file.try_lock_shared().is_ok() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let rows = read_rows(&name, &file);
        live.push((name, rows));
    }
    live
}

/// The rows of the journal at `path` with sequence numbers in
/// (`after`, `upto`]: rows a failed commit left behind, to try again.
pub(crate) fn read_range(path: &Path, after: u64, upto: u64) -> Vec<JournaledRow> {
    let Ok(file) = File::open(path) else {
        return Vec::new();
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    read_rows(&name, &file)
        .into_iter()
        .filter(|row| row.seq > after && row.seq <= upto)
        .collect()
}

/// A journaled row's cells as SQLite values, in its insert's order.
pub(crate) fn sql_values(cells: Vec<Value>) -> impl Iterator<Item = SqlValue> {
    cells.into_iter().map(|cell| match cell {
        Value::Null => SqlValue::Null,
        Value::Number(n) => SqlValue::Integer(n.as_i64().unwrap_or_default()),
        Value::String(s) => SqlValue::Text(s),
        other => SqlValue::Text(other.to_string()),
    })
}

/// Writes the rows of every journal next to `db` whose owner is gone, then
/// deletes those journals. Returns how many rows it wrote.
pub(crate) fn replay_orphans(db: &Path) -> rusqlite::Result<usize> {
    let dir = dir_of(db);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(0);
    };
    let mut conn: Option<Connection> = None;
    let mut written = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|ext| ext != "jsonl") {
            continue;
        }
        let Some(file) = claim_orphan(&path) else {
            continue;
        };
        let conn = match &mut conn {
            Some(conn) => conn,
            slot => {
                let opened = Connection::open(db)?;
                opened.busy_timeout(std::time::Duration::from_secs(5))?;
                slot.insert(opened)
            }
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        written += replay_one(conn, &name, &file)?;
        // Deleted while still locked, so nobody replays it twice.
        let _ = std::fs::remove_file(&path);
        drop(file);
    }
    Ok(written)
}

/// The journal at `path`, locked, if its owner is gone and it is still there.
fn claim_orphan(path: &Path) -> Option<File> {
    let file = File::open(path).ok()?;
    file.try_lock().ok()?;
    // Another opener may have replayed and deleted it between our open and
    // our lock: then the path is gone or names another file.
    let held = file.metadata().ok()?;
    let now = std::fs::metadata(path).ok()?;
    (held.ino() == now.ino() && held.dev() == now.dev()).then_some(file)
}

fn replay_one(conn: &mut Connection, name: &str, file: &File) -> rusqlite::Result<usize> {
    let applied: i64 = conn
        .query_row(
            "SELECT applied FROM audit_journal WHERE name = ?1",
            [name],
            |row| row.get(0),
        )
        .unwrap_or(0);
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let mut written = 0;
    for line in read_rows(name, file) {
        if i64::try_from(line.seq).unwrap_or(i64::MAX) <= applied {
            continue;
        }
        tx.prepare_cached(insert_sql_for(Backend::Sqlite, line.kind))?
            .execute(params_from_iter(sql_values(line.cells)))?;
        written += 1;
    }
    tx.execute("DELETE FROM audit_journal WHERE name = ?1", [name])?;
    tx.commit()?;
    if written > 0 {
        tracing::info!(
            journal = name,
            rows = written,
            "audit journal of a stopped process written"
        );
    }
    Ok(written)
}
