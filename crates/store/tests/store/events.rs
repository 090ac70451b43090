use std::time::Duration;

use manifold_store::{AuditCommit, AuditWriter, Effect, NewPolicy, Notice, StoreEvent};
use manifold_test_postgres::{TestDatabase, on_both_backends};

use crate::{is_postgres, open};

on_both_backends!(
    events_reach_every_process_on_postgres,
    the_generation_reader_sees_governance_writes_only,
);

async fn next(subscription: &mut manifold_store::Subscription) -> Notice {
    tokio::time::timeout(Duration::from_secs(10), subscription.recv())
        .await
        .expect("a notice within 10 s")
        .expect("the subscription is live")
}

async fn events_reach_every_process_on_postgres(db: TestDatabase) {
    // Two stores on one database behave like two gateway processes.
    let a = open(&db).await;
    let b = open(&db).await;
    let (Some(mut heard_by_a), Some(mut heard_by_b)) =
        (a.subscribe().await.unwrap(), b.subscribe().await.unwrap())
    else {
        assert!(!is_postgres(&db), "PostgreSQL subscribes");
        // SQLite: one process, nothing to tell; publishing is a no-op.
        a.publish(StoreEvent::ToolsChanged { server: "x".into() })
            .await;
        return;
    };
    let event = StoreEvent::ServerSwitched {
        server: "gamma".into(),
        enabled: true,
    };
    a.publish(event.clone()).await;
    assert_eq!(
        next(&mut heard_by_b).await,
        Notice::Event {
            event: event.clone(),
            own: false
        }
    );
    assert_eq!(
        next(&mut heard_by_a).await,
        Notice::Event { event, own: true }
    );

    // Deciding an approval is announced by the store itself, whoever decides.
    let id = a
        .create_approval(
            "p",
            "files__delete",
            "h",
            &serde_json::json!({}),
            manifold_store::now_ms() + 60_000,
        )
        .await
        .unwrap();
    b.decide_approval(&id, true, "op").await.unwrap();
    assert_eq!(
        next(&mut heard_by_a).await,
        Notice::Event {
            event: StoreEvent::ApprovalDecided { id },
            own: false
        }
    );
}

/// The generation a watch reads moves when another process writes
/// governance, and stays put for audit rows; on a SQLite file it is read
/// through a connection of the reader's own.
async fn the_generation_reader_sees_governance_writes_only(db: TestDatabase) {
    let watcher = open(&db).await;
    let other = open(&db).await;
    let reader = watcher.generation_reader();
    assert_eq!(reader.reads_directly(), !is_postgres(&db));
    let before = reader.read().await.unwrap();
    assert_eq!(before, watcher.governance_generation().await.unwrap());

    let writer = AuditWriter::start(other.clone(), AuditCommit::Sync);
    writer.record(crate::audit_writer::row(1)).await.unwrap();
    assert_eq!(reader.read().await.unwrap(), before, "an audit row");

    other
        .create_policy(NewPolicy::new(Effect::Deny))
        .await
        .unwrap();
    let after = reader.read().await.unwrap();
    assert_ne!(after, before, "a policy written by another process");
    assert_eq!(after, watcher.governance_generation().await.unwrap());
}
