use manifold_test_postgres::{TestDatabase, on_both_backends};

use crate::{HOUR, T0, open};

on_both_backends!(
    a_task_route_is_found_only_by_its_owner,
    a_task_route_expires_and_is_swept,
);

async fn a_task_route_is_found_only_by_its_owner(db: TestDatabase) {
    let store = open(&db).await;
    let id = store
        .create_task_route("token:a", ("files", "files__sync"), "up-1", T0, HOUR)
        .await
        .unwrap();
    let other = store
        .create_task_route("token:a", ("files", "files__sync"), "up-2", T0, HOUR)
        .await
        .unwrap();
    assert_ne!(id, other, "every task gets its own id");
    assert!(id.len() >= 22, "a task id is 128 random bits: {id}");
    let route = store.task_route("token:a", &id, T0 + 1).await.unwrap();
    let route = route.expect("the owner finds its task");
    assert_eq!(
        (route.server.as_str(), route.upstream_id.as_str()),
        ("files", "up-1")
    );
    assert_eq!(route.expires_at, T0 + HOUR);
    assert_eq!(route.tool, "files__sync");
    // Its end is noted once, whichever replica sees it first.
    assert!(store.end_task_route(&id, T0 + 2).await.unwrap());
    assert!(!store.end_task_route(&id, T0 + 3).await.unwrap());
    assert_eq!(
        store.task_route("token:b", &id, T0 + 1).await.unwrap(),
        None
    );
    assert_eq!(store.task_route("token:a", "nope", T0).await.unwrap(), None);
}

async fn a_task_route_expires_and_is_swept(db: TestDatabase) {
    let store = open(&db).await;
    let id = store
        .create_task_route("user:u", ("files", "files__sync"), "up", T0, HOUR)
        .await
        .unwrap();
    assert_eq!(
        store.task_route("user:u", &id, T0 + HOUR).await.unwrap(),
        None
    );
    assert_eq!(store.sweep_tasks(T0 + HOUR - 1).await.unwrap(), 0);
    assert_eq!(store.sweep_tasks(T0 + HOUR).await.unwrap(), 1);
}
