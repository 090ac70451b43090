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

use std::sync::atomic::Ordering;

use sqlx::Row;

use crate::{Backend, Result, Store};

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
            Backend::Sqlite => "SELECT value FROM governance_generation WHERE id = 1",
            Backend::Postgres => "SELECT last_value FROM governance_generation",
        };
        let row = sqlx::query(sql).fetch_one(self.pool()).await?;
        Ok(row.try_get(0)?)
    }
}
