//! Store tests. Every test runs twice: on SQLite and on PostgreSQL (a
//! throwaway cluster shared by this test binary, one database per test).

mod approvals;
mod audit;
mod audit_writer;
mod chart;
mod events;
mod gateway_tasks;
mod oauth;
mod policy;
mod rate_limits;
mod tasks;
mod tokens;
mod tools;

use manifold_store::{AuditCommit, AuditRow, AuditWriter, Backend, Store};
use manifold_test_postgres::TestDatabase;

/// A fixed "now" for tests that do not care about the wall clock.
pub const T0: i64 = 1_800_000_000_000;
pub const HOUR: i64 = 3_600_000;

/// A store on the database, checked to be on the expected backend.
pub async fn open(db: &TestDatabase) -> Store {
    let store = db.store().await;
    assert_eq!(store.backend(), db.backend());
    store
}

#[allow(dead_code)]
pub fn is_postgres(db: &TestDatabase) -> bool {
    db.backend() == Backend::Postgres
}

/// Commits `row` as a gateway writes audit rows, through an audit writer,
/// in a transaction of its own (so identical access failures stay separate
/// rows), before it returns.
pub async fn commit_row(store: &Store, row: AuditRow) {
    let writer = AuditWriter::start(store.clone(), AuditCommit::Sync);
    writer.record(row).await.unwrap();
    writer.flush().await.unwrap();
}
