//! Reading the audit trails: the database and, on a SQLite file, the
//! journals of the gateways running on it.
//!
//! A gateway with `audit_commit = "sync"` answers once its row is in its
//! journal (`journal.rs`); the commit follows a moment later. A reader in
//! another process (the CLI, another replica's admin API) therefore reads
//! the live journals too: first the files, then the rows and the journals'
//! marks in one snapshot, keeping the journaled rows beyond each mark. A
//! row committed in between is in the snapshot and below its mark, so it
//! is shown once; a journal emptied in between held only committed rows.
//! A journal's mark is written as it starts and deleted as it ends, so a
//! journal without one in the snapshot has every row committed.

use std::collections::HashMap;

use serde_json::{Map, Value};
use sqlx::{AnyConnection, Row};

use crate::{
    Result, Store,
    audit::{AuditKind, audit_json, insert_columns},
    journal::{self, JournaledRow},
};

/// Rows of the live journals, by journal name.
type Live = Vec<(String, Vec<JournaledRow>)>;

impl Store {
    /// The last `n` rows of one trail, oldest first, as JSON objects (one per
    /// line in a JSON-lines export). Each carries `"kind"`; a row still only
    /// in a running gateway's journal has no `"id"` yet.
    pub async fn audit_tail(&self, kind: AuditKind, n: usize) -> Result<Vec<Value>> {
        self.settle_audit().await;
        let live = self.live_journals().await;
        let sql = format!(
            "SELECT * FROM ({} ORDER BY id DESC LIMIT $1) AS tail ORDER BY id",
            kind.select()
        );
        let mut tx = self.pool().begin().await?;
        let rows = self
            .query(&sql)
            .bind(i64::try_from(n).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await?;
        let mut out = rows
            .iter()
            .map(|row| audit_json(kind, row))
            .collect::<Result<Vec<_>>>()?;
        out.extend(self.unapplied(&mut tx, kind, live, i64::MIN).await?);
        let skip = out.len().saturating_sub(n);
        out.drain(..skip);
        Ok(out)
    }

    /// Every row of one trail created at or after `since` (unix ms), oldest
    /// first, as JSON objects.
    pub async fn audit_export(&self, kind: AuditKind, since: i64) -> Result<Vec<Value>> {
        self.settle_audit().await;
        let live = self.live_journals().await;
        let sql = format!("{} WHERE created_at >= $1 ORDER BY id", kind.select());
        let mut tx = self.pool().begin().await?;
        let rows = self.query(&sql).bind(since).fetch_all(&mut *tx).await?;
        let mut out = rows
            .iter()
            .map(|row| audit_json(kind, row))
            .collect::<Result<Vec<_>>>()?;
        out.extend(self.unapplied(&mut tx, kind, live, since).await?);
        Ok(out)
    }

    /// The live journals beside a SQLite file, read before the snapshot.
    async fn live_journals(&self) -> Live {
        let Some(path) = self.sqlite_path() else {
            return Vec::new();
        };
        tokio::task::spawn_blocking(move || journal::read_live(&path))
            .await
            .unwrap_or_default()
    }

    /// The rows of `kind` in `live` that the snapshot `conn` reads has not
    /// committed, created at or after `since`, oldest first.
    async fn unapplied(
        &self,
        conn: &mut AnyConnection,
        kind: AuditKind,
        live: Live,
        since: i64,
    ) -> Result<Vec<Value>> {
        if live.is_empty() {
            return Ok(Vec::new());
        }
        let marks: HashMap<String, i64> = self
            .query("SELECT name, applied FROM audit_journal")
            .fetch_all(&mut *conn)
            .await?
            .iter()
            .map(|row| Ok((row.try_get("name")?, row.try_get("applied")?)))
            .collect::<Result<_>>()?;
        let mut out = Vec::new();
        let mut tokens: HashMap<String, bool> = HashMap::new();
        for (name, rows) in live {
            // No mark: the journal has ended (or been replayed), every row
            // of it committed.
            let Some(&applied) = marks.get(&name) else {
                continue;
            };
            for row in rows {
                if row.kind != kind || i64::try_from(row.seq).unwrap_or(i64::MAX) <= applied {
                    continue;
                }
                let Some(mut json) = journaled_json(kind, row.cells) else {
                    continue;
                };
                if json["created_at"].as_i64().unwrap_or(i64::MIN) < since {
                    continue;
                }
                // As the insert does: the column names a token still there.
                if let Some(id) = json["token_id"].as_str().map(str::to_string) {
                    let exists = match tokens.get(&id) {
                        Some(exists) => *exists,
                        None => {
                            let found = self
                                .query("SELECT id FROM tokens WHERE id = $1")
                                .bind(id.clone())
                                .fetch_optional(&mut *conn)
                                .await?
                                .is_some();
                            *tokens.entry(id).or_insert(found)
                        }
                    };
                    if !exists {
                        json["token_id"] = Value::Null;
                    }
                }
                out.push(json);
            }
        }
        out.sort_by_key(|row| row["created_at"].as_i64().unwrap_or(0));
        Ok(out)
    }
}

/// A journaled row as [`audit_json`] shows a committed one, without an id.
fn journaled_json(kind: AuditKind, cells: Vec<Value>) -> Option<Value> {
    let columns = std::iter::once("token_id").chain(insert_columns(kind).split(',').map(str::trim));
    let mut out = Map::new();
    out.insert("kind".into(), kind.as_str().into());
    out.insert("id".into(), Value::Null);
    let mut count = 0;
    for (column, cell) in columns.zip(cells) {
        count += 1;
        let cell = match (column, cell) {
            ("details", Value::String(text)) => serde_json::from_str(&text).ok()?,
            (_, cell) => cell,
        };
        out.insert(column.into(), cell);
    }
    (count == insert_columns(kind).split(',').count() + 1).then_some(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AccessEvent, AuditRow, audit::row_cells};

    #[test]
    fn a_journaled_row_reads_as_a_committed_one_without_its_id() {
        let row = AuditRow::Access(
            AccessEvent::failure(7, Some("abc"), "revoked").details(serde_json::json!({"n": 1})),
        );
        let cells: Vec<Value> = row_cells(&row)
            .unwrap()
            .iter()
            .map(|cell| match cell {
                crate::audit::Cell::Text(text) => text.map_or(Value::Null, |t| t.into()),
                crate::audit::Cell::Owned(text) => text.clone().into(),
                crate::audit::Cell::Int(n) => (*n).into(),
            })
            .collect();
        let json = journaled_json(AuditKind::Access, cells).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "kind": "access", "id": null, "created_at": 7, "principal": null,
                "token_id": "abc", "outcome": "failure", "reason": "revoked",
                "details": {"n": 1, "token_id": "abc"},
            })
        );
    }
}
