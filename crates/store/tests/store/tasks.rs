use manifold_store::{NewTaskRoute, UnseenTaskEnd};
use manifold_test_postgres::{TestDatabase, on_both_backends};

use crate::{HOUR, T0, open};

on_both_backends!(
    a_task_route_is_found_only_by_its_owner,
    a_task_route_expires_and_is_swept,
);

fn route<'a>(owner: &'a str, upstream_id: &'a str) -> NewTaskRoute<'a> {
    NewTaskRoute {
        owner,
        principal: "ci-bot",
        token_id: Some("tok-1"),
        server: "files",
        tool: "files__sync",
        upstream_id,
        replica: Some("replica-a"),
    }
}

async fn a_task_route_is_found_only_by_its_owner(db: TestDatabase) {
    let store = open(&db).await;
    let id = store
        .create_task_route(route("token:a", "up-1"), T0, HOUR)
        .await
        .unwrap();
    let other = store
        .create_task_route(route("token:a", "up-2"), T0, HOUR)
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
    assert_eq!(route.replica.as_deref(), Some("replica-a"));
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
    let unseen = store
        .create_task_route(route("user:u", "up"), T0, HOUR)
        .await
        .unwrap();
    let seen = store
        .create_task_route(route("user:u", "up-2"), T0, HOUR)
        .await
        .unwrap();
    assert!(store.end_task_route(&seen, T0 + 1).await.unwrap());
    assert_eq!(
        store
            .task_route("user:u", &unseen, T0 + HOUR)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store.sweep_tasks(T0 + HOUR - 1).await.unwrap(),
        Default::default()
    );
    let swept = store.sweep_tasks(T0 + HOUR).await.unwrap();
    assert_eq!(swept.swept, 2);
    // Only the task nobody saw end is handed back, for its end row.
    assert_eq!(
        swept.unseen,
        vec![UnseenTaskEnd {
            id: unseen,
            principal: "ci-bot".into(),
            token_id: Some("tok-1".into()),
            tool: "files__sync".into(),
        }]
    );
    assert_eq!(
        store.sweep_tasks(T0 + HOUR).await.unwrap(),
        Default::default()
    );
}
