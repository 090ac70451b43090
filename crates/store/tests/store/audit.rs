use manifold_store::{
    AccessEvent, Action, ActivityEvent, AuditCommit, AuditKind, AuditRow, AuditWriter, AuthError,
    CallOutcome, Decision, DiscoveryEvent, Expiry, NewToken, hash_arguments, token_id_of,
    visible_tools_digest,
};
use manifold_test_postgres::{TestDatabase, on_both_backends};
use serde_json::{Value, json};

use crate::{HOUR, T0, commit_row, open};

on_both_backends!(
    audit_rows_survive_token_deletion,
    discovery_audit_holds_a_digest_not_names,
    access_audit_records_successes_and_failures,
    tail_and_export,
    audit_inserts_race_token_deletion,
    old_audit_rows_are_swept_in_batches_and_new_ones_stay,
    a_writer_batch_keeps_every_row_and_field,
);

fn activity(at: i64, token_id: Option<&str>, tool: &str) -> ActivityEvent {
    ActivityEvent {
        at,
        principal: "p-digest".to_string(),
        token_id: token_id.map(str::to_string),
        tool: tool.to_string(),
        args_hash: hash_arguments(&json!({"path": "/tmp/x"})),
        decision: Decision::Allowed,
        approval_id: None,
        outcome: CallOutcome::Success,
        latency_ms: 12,
        bytes_in: 40,
        bytes_out: 900,
        details: json!({"server": "files"}),
    }
}

async fn audit_rows_survive_token_deletion(db: TestDatabase) {
    let store = open(&db).await;
    let (token, _) = store
        .create_token_at(
            NewToken::new("short", [Action::Call], ["*"]).expiry(Expiry::At(T0 + HOUR)),
            T0,
        )
        .await
        .unwrap();
    let id = token.id.as_str();

    // While the token exists, the FK column is set.
    commit_row(
        &store,
        AuditRow::Discovery(DiscoveryEvent::new(
            T0 + 1,
            "p-digest",
            Some(id),
            &["files__read"],
        )),
    )
    .await;
    commit_row(
        &store,
        AuditRow::Access(AccessEvent::success(T0 + 2, "p-digest", Some(id))),
    )
    .await;
    commit_row(
        &store,
        AuditRow::Activity(activity(T0 + 3, Some(id), "files__read")),
    )
    .await;
    for kind in AuditKind::ALL {
        let rows = store.audit_export(kind, 0).await.unwrap();
        assert_eq!(rows.len(), 1, "{kind}");
        assert_eq!(rows[0]["token_id"], json!(id), "{kind}");
        assert_eq!(rows[0]["details"]["token_id"], json!(id), "{kind}");
    }

    // The sweep removes the expired token; the audit rows stay, FK null,
    // original id in details.
    assert_eq!(
        store.sweep_all_expired(T0 + 2 * HOUR).await.unwrap(),
        vec![1]
    );
    assert_eq!(store.get_token(id).await.unwrap(), None);
    for kind in AuditKind::ALL {
        let rows = store.audit_export(kind, 0).await.unwrap();
        assert_eq!(rows.len(), 1, "{kind}: the row survived");
        assert_eq!(rows[0]["token_id"], Value::Null, "{kind}");
        assert_eq!(rows[0]["details"]["token_id"], json!(id), "{kind}");
    }

    // Inserts that name the already-deleted token resolve the reference in
    // the same statement: FK NULL, no foreign-key error, id kept in details.
    commit_row(
        &store,
        AuditRow::Discovery(DiscoveryEvent::new(
            T0 + 4,
            "p-digest",
            Some(id),
            &["files__read"],
        )),
    )
    .await;
    commit_row(
        &store,
        AuditRow::Access(AccessEvent::failure(
            T0 + 5,
            Some(id),
            AuthError::Unknown.reason(),
        )),
    )
    .await;
    commit_row(
        &store,
        AuditRow::Activity(activity(T0 + 6, Some(id), "files__read")),
    )
    .await;
    for kind in AuditKind::ALL {
        let rows = store.audit_export(kind, T0 + 4).await.unwrap();
        assert_eq!(rows.len(), 1, "{kind}");
        assert_eq!(rows[0]["token_id"], Value::Null, "{kind}");
        assert_eq!(rows[0]["details"]["token_id"], json!(id), "{kind}");
    }

    // Rows without any token are fine too.
    commit_row(
        &store,
        AuditRow::Activity(activity(T0 + 7, None, "files__read")),
    )
    .await;
    let last = store.audit_tail(AuditKind::Activity, 1).await.unwrap();
    assert_eq!(last[0]["token_id"], Value::Null);
    assert_eq!(last[0]["details"], json!({"server": "files"}));
}

async fn discovery_audit_holds_a_digest_not_names(db: TestDatabase) {
    let store = open(&db).await;
    let names = [
        "github__create_issue",
        "github__list_repos",
        "secret_server__launch_missiles",
    ];
    let event =
        DiscoveryEvent::new(T0, "p-digest", None, &names).details(json!({"mode": "progressive"}));
    assert!(!format!("{event:?}").contains("launch_missiles"));
    commit_row(&store, AuditRow::Discovery(event.clone())).await;

    let rows = store.audit_export(AuditKind::Discovery, 0).await.unwrap();
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(row["kind"], json!("discovery"));
    assert_eq!(row["visible_count"], json!(3));
    let mut shuffled = names;
    shuffled.reverse();
    assert_eq!(
        row["visible_digest"],
        json!(visible_tools_digest(&shuffled))
    );
    assert_eq!(row["details"], json!({"mode": "progressive"}));
    let text = row.to_string();
    for name in names {
        let (server, tool) = name.split_once("__").unwrap();
        assert!(!text.contains(tool), "{tool} leaked into {text}");
        assert!(!text.contains(server), "{server} leaked into {text}");
    }
}

async fn access_audit_records_successes_and_failures(db: TestDatabase) {
    let store = open(&db).await;
    let (token, bearer) = store
        .create_token_at(NewToken::new("ci", [Action::Call], ["*"]), T0)
        .await
        .unwrap();
    commit_row(
        &store,
        AuditRow::Access(AccessEvent::success(T0, "p-1", Some(&token.id))),
    )
    .await;
    let forged = format!("mfd_{}_{}", token.id, "A".repeat(43));
    let err = store.authenticate(&forged, T0).await.unwrap_err();
    commit_row(
        &store,
        AuditRow::Access(
            AccessEvent::failure(T0 + 1, token_id_of(&forged), err.reason())
                .details(json!({"remote": "127.0.0.1"})),
        ),
    )
    .await;
    commit_row(
        &store,
        AuditRow::Access(AccessEvent::failure(
            T0 + 2,
            token_id_of("garbage"),
            "malformed",
        )),
    )
    .await;
    assert!(store.authenticate(&bearer, T0).await.is_ok());

    let rows = store.audit_export(AuditKind::Access, 0).await.unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["outcome"], json!("success"));
    assert_eq!(rows[0]["principal"], json!("p-1"));
    assert_eq!(rows[0]["reason"], Value::Null);
    assert_eq!(rows[1]["outcome"], json!("failure"));
    assert_eq!(rows[1]["reason"], json!("unknown"));
    assert_eq!(rows[1]["token_id"], json!(token.id));
    assert_eq!(rows[1]["details"]["remote"], json!("127.0.0.1"));
    assert_eq!(rows[2]["reason"], json!("malformed"));
    assert_eq!(rows[2]["token_id"], Value::Null);
    assert_eq!(rows[2]["details"], json!({}));
}

async fn tail_and_export(db: TestDatabase) {
    let store = open(&db).await;
    for i in 0..10i64 {
        let mut event = activity(T0 + i, None, &format!("files__tool_{i}"));
        if i == 9 {
            event.decision = Decision::Approved;
            event.approval_id = Some("apr_x".to_string());
            event.outcome = CallOutcome::Error;
        }
        commit_row(&store, AuditRow::Activity(event.clone())).await;
        commit_row(
            &store,
            AuditRow::Discovery(DiscoveryEvent::new(T0 + i, "p", None, &["a__b"])),
        )
        .await;
        commit_row(
            &store,
            AuditRow::Access(AccessEvent::success(T0 + i, "p", None)),
        )
        .await;
    }
    for kind in AuditKind::ALL {
        let tail = store.audit_tail(kind, 3).await.unwrap();
        let times: Vec<i64> = tail
            .iter()
            .map(|r| r["created_at"].as_i64().unwrap())
            .collect();
        assert_eq!(
            times,
            [T0 + 7, T0 + 8, T0 + 9],
            "{kind}: last three, oldest first"
        );
        assert!(tail.iter().all(|r| r["kind"] == json!(kind.as_str())));
        assert_eq!(store.audit_tail(kind, 100).await.unwrap().len(), 10);
        assert!(store.audit_tail(kind, 0).await.unwrap().is_empty());

        let export = store.audit_export(kind, T0 + 5).await.unwrap();
        assert_eq!(export.len(), 5, "{kind}");
        // JSON-lines friendly: every row is one object on one line.
        for row in &export {
            assert!(row.is_object());
            assert!(!row.to_string().contains('\n'));
        }
    }
    let last = &store.audit_tail(AuditKind::Activity, 1).await.unwrap()[0];
    assert_eq!(last["tool"], json!("files__tool_9"));
    assert_eq!(last["decision"], json!("approved"));
    assert_eq!(last["approval_id"], json!("apr_x"));
    assert_eq!(last["outcome"], json!("error"));
    assert_eq!(last["latency_ms"], json!(12));
    assert_eq!(last["bytes_in"], json!(40));
    assert_eq!(last["bytes_out"], json!(900));
    assert_eq!(
        last["args_hash"],
        json!(hash_arguments(&json!({"path": "/tmp/x"})))
    );
}

/// Token deletions racing audit inserts that name the same tokens: every
/// insert succeeds (no foreign-key error), every row is kept, and every row
/// keeps the original id in details.
async fn audit_inserts_race_token_deletion(db: TestDatabase) {
    let a = open(&db).await;
    let b = db.store().await;
    let mut ids = Vec::new();
    for i in 0..60 {
        let (t, _) = a
            .create_token_at(NewToken::new(format!("t{i}"), [Action::Call], ["*"]), T0)
            .await
            .unwrap();
        ids.push(t.id);
    }
    let deleter = {
        let (b, ids) = (b.clone(), ids.clone());
        tokio::spawn(async move {
            for id in ids {
                assert!(b.delete_token(&id).await.unwrap());
            }
        })
    };
    let writer = AuditWriter::start(a.clone(), AuditCommit::Sync);
    let mut writers = Vec::new();
    for (n, id) in ids.iter().enumerate() {
        let (writer, id) = (writer.clone(), id.clone());
        writers.push(tokio::spawn(async move {
            for round in 0..3i64 {
                let at = T0 + round;
                let mut rows = vec![
                    AuditRow::Activity(activity(at, Some(&id), "files__read")),
                    AuditRow::Access(AccessEvent::success(at, "p", Some(&id))),
                ];
                if n % 4 == 0 {
                    rows.push(AuditRow::Discovery(DiscoveryEvent::new(
                        at,
                        "p",
                        Some(&id),
                        &["x__y"],
                    )));
                }
                for row in rows {
                    writer.record(row).await.unwrap();
                }
            }
        }));
    }
    deleter.await.unwrap();
    for w in writers {
        w.await.unwrap();
    }
    writer.flush().await.unwrap();
    let expected = [
        (AuditKind::Activity, 180),
        (AuditKind::Access, 180),
        (AuditKind::Discovery, 45),
    ];
    for (kind, count) in expected {
        let rows = a.audit_export(kind, 0).await.unwrap();
        assert_eq!(rows.len(), count, "{kind}");
        for row in rows {
            assert_eq!(row["token_id"], Value::Null, "{kind}: every token is gone");
            let original = row["details"]["token_id"].as_str().unwrap();
            assert!(ids.iter().any(|id| id == original), "{kind}");
        }
    }
}

/// `audit_retention_days`: every trail loses exactly its rows older than the
/// cut-off, more than one sweep batch of them, and keeps the rest.
async fn old_audit_rows_are_swept_in_batches_and_new_ones_stay(db: TestDatabase) {
    let store = open(&db).await;
    let old = manifold_store::SWEEP_BATCH + 7;
    for i in 0..old {
        let at = T0 + i as i64;
        commit_row(
            &store,
            AuditRow::Activity(activity(at, None, "files__read")),
        )
        .await;
        commit_row(
            &store,
            AuditRow::Access(AccessEvent::failure(at, None, "malformed")),
        )
        .await;
    }
    let cut = T0 + HOUR;
    for i in 0..3 {
        let at = cut + i;
        commit_row(
            &store,
            AuditRow::Activity(activity(at, None, "files__read")),
        )
        .await;
        commit_row(
            &store,
            AuditRow::Access(AccessEvent::failure(at, None, "malformed")),
        )
        .await;
    }
    assert_eq!(
        store.sweep_audit(AuditKind::Activity, cut).await.unwrap(),
        old as u64
    );
    assert_eq!(
        store.sweep_audit(AuditKind::Access, cut).await.unwrap(),
        old as u64
    );
    for kind in [AuditKind::Activity, AuditKind::Access] {
        let rows = store.audit_export(kind, 0).await.unwrap();
        assert_eq!(rows.len(), 3, "{kind:?}");
        assert!(
            rows.iter()
                .all(|r| r["created_at"].as_i64().unwrap() >= cut),
            "{rows:?}"
        );
    }
    // Nothing left to sweep.
    assert_eq!(
        store.sweep_audit(AuditKind::Activity, cut).await.unwrap(),
        0
    );
}

/// Rows queued together are committed as one batch (on SQLite, a small one
/// as one statement list): every row keeps its kind, its order and its
/// fields, and a token id resolves to the token while it exists and to NULL
/// once it is gone.
async fn a_writer_batch_keeps_every_row_and_field(db: TestDatabase) {
    let store = open(&db).await;
    let (token, _) = store
        .create_token_at(NewToken::new("batch", [Action::Call], ["*"]), T0)
        .await
        .unwrap();
    let live = token.id.as_str();
    let writer = AuditWriter::start(store.clone(), AuditCommit::Async);
    // A batch of 3, then one of 27.
    for i in 0..30 {
        if i == 3 {
            writer.flush().await.unwrap();
        }
        let at = T0 + i;
        let token = if i % 2 == 0 { Some(live) } else { Some("gone") };
        let row = match i % 3 {
            0 => AuditRow::Activity(ActivityEvent {
                latency_ms: i as u64,
                ..activity(at, token, &format!("files__read_{i}"))
            }),
            1 => AuditRow::Access(AccessEvent::success(at, format!("p-{i}"), token)),
            _ => AuditRow::Discovery(DiscoveryEvent::new(at, "p-digest", token, &["a__b"; 2])),
        };
        writer.record(row).await.unwrap();
    }
    writer.flush().await.unwrap();
    for kind in AuditKind::ALL {
        let rows = store.audit_export(kind, 0).await.unwrap();
        assert_eq!(rows.len(), 10, "{kind}");
        for row in rows {
            let i = row["created_at"].as_i64().unwrap() - T0;
            let expected = if i % 2 == 0 { json!(live) } else { Value::Null };
            assert_eq!(row["token_id"], expected, "{kind} {row}");
            match kind {
                AuditKind::Activity => {
                    assert_eq!(row["tool"], json!(format!("files__read_{i}")));
                    assert_eq!(row["latency_ms"], json!(i));
                }
                AuditKind::Access => assert_eq!(row["principal"], json!(format!("p-{i}"))),
                AuditKind::Discovery => assert_eq!(row["visible_count"], json!(2)),
            }
        }
    }
}

/// The migration that dropped AUTOINCREMENT keeps every row and its id, and
/// new rows go on from the largest id. Anonymous rows stay out of the
/// token_id index, and a token's rows are still found through it.
#[tokio::test]
async fn audit_rows_survive_the_pages_migration() {
    use sqlx::{Connection, Executor};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(manifold_store::SQLITE_FILE_NAME);
    let url = format!("sqlite://{}?mode=rwc", path.display());
    {
        let mut migrator = sqlx::migrate!("./migrations/sqlite");
        let before: Vec<_> = migrator
            .migrations
            .iter()
            .filter(|m| m.version < 6)
            .cloned()
            .collect();
        migrator.migrations = before.into();
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        migrator.run(&mut conn).await.unwrap();
        for id in [3, 7, 9] {
            conn.execute(
                format!(
                    "INSERT INTO activity_audit (id, created_at, principal, tool, args_hash, \
                     decision, outcome, latency_ms, bytes_in, bytes_out, details) \
                     VALUES ({id}, {id}, 'p', 'files__read', 'h', 'allowed', 'success', 1, 2, 3, '{{}}')"
                )
                .as_str(),
            )
            .await
            .unwrap();
        }
        conn.close().await.unwrap();
    }
    let store = manifold_store::Store::open_data_dir(dir.path())
        .await
        .unwrap();
    let ids = |rows: Vec<serde_json::Value>| -> Vec<i64> {
        rows.iter().map(|r| r["id"].as_i64().unwrap()).collect()
    };
    assert_eq!(
        ids(store.audit_export(AuditKind::Activity, 0).await.unwrap()),
        [3, 7, 9]
    );
    commit_row(
        &store,
        AuditRow::Activity(activity(T0, None, "files__read")),
    )
    .await;
    assert_eq!(
        ids(store.audit_export(AuditKind::Activity, 0).await.unwrap()),
        [3, 7, 9, 10]
    );
    let (token, _) = store
        .create_token(NewToken::new("t", [Action::Call], ["*"]))
        .await
        .unwrap();
    commit_row(
        &store,
        AuditRow::Activity(activity(T0, Some(&token.id), "files__read")),
    )
    .await;
    store.close().await;

    let conn = rusqlite::Connection::open(&path).unwrap();
    let index: String = conn
        .query_row(
            "SELECT sql FROM sqlite_master WHERE name = 'activity_audit_token_id'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert!(index.contains("WHERE token_id IS NOT NULL"), "{index}");
    let indexed: i64 = conn
        .query_row(
            "SELECT count(*) FROM activity_audit INDEXED BY activity_audit_token_id \
             WHERE token_id IS NOT NULL",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(indexed, 1, "only the token's row is in the index");
    let plan: String = conn
        .query_row(
            "EXPLAIN QUERY PLAN SELECT id FROM activity_audit WHERE token_id = ?1",
            [&token.id],
            |row| row.get(3),
        )
        .unwrap();
    assert!(plan.contains("activity_audit_token_id"), "{plan}");
    let autoincrement: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE sql LIKE '%AUTOINCREMENT%' \
             AND name LIKE '%audit%'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(autoincrement, 0);
}
