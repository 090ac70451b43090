use manifold_store::{NewGatewayTask, TASK_WORKING};
use manifold_test_postgres::{TestDatabase, on_both_backends};

use crate::{HOUR, T0, open};

on_both_backends!(
    a_gateway_task_is_its_owners_and_ends_once,
    an_owner_has_at_most_max_open_working_tasks,
    a_cancel_names_the_running_replica,
    a_restart_fails_the_replicas_working_tasks_and_the_sweep_deletes_expired_ones,
);

fn new<'a>(owner: &'a str, replica: &'a str, max_open: u64) -> NewGatewayTask<'a> {
    NewGatewayTask {
        owner,
        server: "slow",
        tool: "slow__export",
        replica,
        now: T0,
        ttl_ms: HOUR,
        max_open,
    }
}

async fn a_gateway_task_is_its_owners_and_ends_once(db: TestDatabase) {
    let store = open(&db).await;
    let id = store
        .create_gateway_task(&new("token:a", "r1", 4))
        .await
        .unwrap()
        .expect("under the limit");
    assert_eq!(id.len(), 22, "128 random bits: {id}");
    let task = store
        .gateway_task("token:a", &id, T0 + 1)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(task.status, TASK_WORKING);
    assert_eq!(
        (task.server.as_str(), task.tool.as_str()),
        ("slow", "slow__export")
    );
    assert_eq!(task.payload, None);
    assert_eq!(
        store.gateway_task("token:b", &id, T0 + 1).await.unwrap(),
        None
    );

    assert!(
        store
            .finish_gateway_task(&id, "completed", None, Some("sealed"), T0 + 5)
            .await
            .unwrap()
    );
    // The first end stands.
    assert!(
        !store
            .finish_gateway_task(&id, "failed", Some("late"), None, T0 + 6)
            .await
            .unwrap()
    );
    let task = store
        .gateway_task("token:a", &id, T0 + 7)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(task.status, "completed");
    assert_eq!(task.payload.as_deref(), Some("sealed"));
    assert_eq!(task.updated_at, T0 + 5);
}

async fn an_owner_has_at_most_max_open_working_tasks(db: TestDatabase) {
    let store = open(&db).await;
    let first = store
        .create_gateway_task(&new("user:u", "r1", 2))
        .await
        .unwrap();
    let second = store
        .create_gateway_task(&new("user:u", "r1", 2))
        .await
        .unwrap();
    assert!(first.is_some() && second.is_some());
    assert_eq!(
        store
            .create_gateway_task(&new("user:u", "r1", 2))
            .await
            .unwrap(),
        None
    );
    // Another owner has its own count; an ended task frees a place.
    assert!(
        store
            .create_gateway_task(&new("user:v", "r1", 2))
            .await
            .unwrap()
            .is_some()
    );
    store
        .finish_gateway_task(&first.unwrap(), "cancelled", None, None, T0 + 1)
        .await
        .unwrap();
    assert_eq!(store.open_gateway_tasks("user:u", T0 + 1).await.unwrap(), 1);
    assert!(
        store
            .create_gateway_task(&new("user:u", "r1", 2))
            .await
            .unwrap()
            .is_some()
    );
}

async fn a_cancel_names_the_running_replica(db: TestDatabase) {
    let store = open(&db).await;
    let id = store
        .create_gateway_task(&new("token:a", "replica-7", 4))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store
            .request_gateway_task_cancel("token:b", &id, T0 + 1)
            .await
            .unwrap(),
        None,
        "another owner cannot cancel it"
    );
    assert_eq!(
        store
            .request_gateway_task_cancel("token:a", &id, T0 + 1)
            .await
            .unwrap()
            .as_deref(),
        Some("replica-7")
    );
    assert!(
        store
            .gateway_task("token:a", &id, T0 + 2)
            .await
            .unwrap()
            .unwrap()
            .cancel_requested
    );
    store
        .finish_gateway_task(&id, "cancelled", None, None, T0 + 3)
        .await
        .unwrap();
    assert_eq!(
        store
            .request_gateway_task_cancel("token:a", &id, T0 + 4)
            .await
            .unwrap(),
        None,
        "an ended task has nothing to cancel"
    );
}

async fn a_restart_fails_the_replicas_working_tasks_and_the_sweep_deletes_expired_ones(
    db: TestDatabase,
) {
    let store = open(&db).await;
    let mine = store
        .create_gateway_task(&new("token:a", "old", 9))
        .await
        .unwrap()
        .unwrap();
    let theirs = store
        .create_gateway_task(&new("token:a", "other", 9))
        .await
        .unwrap()
        .unwrap();
    let failed = store
        .fail_gateway_tasks_of("old", "the gateway restarted", T0 + 1)
        .await
        .unwrap();
    assert_eq!(failed, 1);
    let mine = store
        .gateway_task("token:a", &mine, T0 + 2)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(mine.status, "failed");
    assert_eq!(mine.message.as_deref(), Some("the gateway restarted"));
    let still = store
        .gateway_task("token:a", &theirs, T0 + 2)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(still.status, TASK_WORKING);

    assert_eq!(
        store
            .gateway_task("token:a", &theirs, T0 + HOUR)
            .await
            .unwrap(),
        None
    );
    assert_eq!(store.sweep_tasks(T0 + HOUR).await.unwrap().swept, 2);
}
