//! How a process learns that governance changed, so that it can keep tokens,
//! groups, policies and classifications in memory between changes.
//!
//! Two signals, both bumped only by governance writes (never by audit or
//! rate-limit rows):
//! - this store's own writes, counted in memory at the moment each commits
//!   ([`Store::governance_writes`]);
//! - the database's generation, which triggers bump on every write to the
//!   governance tables from any process ([`Store::governance_generation`]).
//!   On PostgreSQL the same trigger notifies
//!   listeners ([`crate::StoreEvent::GovernanceChanged`]).

use std::sync::{Mutex, atomic::Ordering};

use rusqlite::{Connection, OpenFlags};
use sqlx::Row;

use crate::{Backend, Result, Store};

const SQLITE_GENERATION: &str = "SELECT value FROM governance_generation WHERE id = 1";

impl Store {
    /// Governance writes this store (and its clones) has committed since it
    /// was opened.
    pub fn governance_writes(&self) -> u64 {
        self.governance_writes.load(Ordering::Acquire)
    }

    /// Called after each write to tokens, groups, policies or
    /// classifications has returned, so readers in this process see the
    /// change at once.
    pub(crate) fn governance_written(&self) {
        self.governance_writes.fetch_add(1, Ordering::AcqRel);
    }

    /// The database's governance generation: changes whenever any process
    /// commits a governance write. Not counted in [`Store::statements`]: it
    /// is read on a timer, never on a request's path.
    pub async fn governance_generation(&self) -> Result<i64> {
        let sql = match self.backend {
            Backend::Sqlite => SQLITE_GENERATION,
            // A new sequence reads `last_value` 1 before its first bump
            // and after it; `is_called` tells the two apart.
            Backend::Postgres => {
                "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM governance_generation"
            }
        };
        let row = sqlx::query(sql).fetch_one(self.pool()).await?;
        Ok(row.try_get(0)?)
    }

    /// A reader of [`Store::governance_generation`] for a watch that reads
    /// it every few milliseconds.
    pub fn generation_reader(&self) -> GenerationReader {
        let direct = self.sqlite_path().and_then(|path| {
            Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .inspect_err(
                |error| tracing::debug!(%error, "generation reader: no connection of its own"),
            )
            .ok()
        });
        GenerationReader {
            store: self.clone(),
            direct: direct.map(Mutex::new),
        }
    }
}

/// Reads the governance generation. On a SQLite file it reads through a
/// connection of its own on the caller's thread: a read in WAL mode waits
/// for no lock, and through sqlx each reading cost two thread wake-ups on
/// its worker thread, every 20 ms, for the life of the gateway. Anywhere
/// else, and if that read fails, through the pool.
pub struct GenerationReader {
    store: Store,
    direct: Option<Mutex<Connection>>,
}

impl GenerationReader {
    /// Whether it reads through a connection of its own.
    pub fn reads_directly(&self) -> bool {
        self.direct.is_some()
    }

    pub async fn read(&self) -> Result<i64> {
        if let Some(conn) = &self.direct {
            let conn = conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let read = conn
                .prepare_cached(SQLITE_GENERATION)
                .and_then(|mut statement| statement.query_row([], |row| row.get(0)));
            match read {
                Ok(generation) => return Ok(generation),
                Err(error) => {
                    tracing::debug!(%error, "generation read directly failed; through the pool")
                }
            }
        }
        self.store.governance_generation().await
    }
}
