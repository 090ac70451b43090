use manifold_test_postgres::{TestDatabase, on_both_backends};

use crate::{T0, open};

on_both_backends!(
    rate_limit_is_shared_between_processes,
    rate_limit_counts_concurrent_hits
);

async fn rate_limit_is_shared_between_processes(db: TestDatabase) {
    // Two stores, two pools: two gateway processes on one database.
    let a = open(&db).await;
    let b = db.store().await;
    let window_start = T0 - T0 % 60_000;
    let now = window_start + 10_000;

    for i in 1..=5u64 {
        let store = if i % 2 == 1 { &a } else { &b };
        let d = store.rate_limit_hit("pol_1:p-1", 60, 5, now).await.unwrap();
        assert!(d.allowed, "hit {i}");
        assert_eq!(d.count, i);
        assert_eq!(d.retry_after_ms, 0);
    }
    let d = b
        .rate_limit_hit("pol_1:p-1", 60, 5, now + 5_000)
        .await
        .unwrap();
    assert!(!d.allowed);
    assert_eq!(d.count, 6);
    assert_eq!(d.retry_after_ms, 45_000);
    let d = a
        .rate_limit_hit("pol_1:p-1", 60, 5, now + 5_000)
        .await
        .unwrap();
    assert!(!d.allowed);
    assert_eq!(d.count, 7);

    // Other keys and other windows count separately.
    let d = a.rate_limit_hit("pol_1:p-2", 60, 5, now).await.unwrap();
    assert_eq!((d.allowed, d.count), (true, 1));
    let d = b
        .rate_limit_hit("pol_1:p-1", 60, 5, window_start + 60_000)
        .await
        .unwrap();
    assert_eq!(
        (d.allowed, d.count),
        (true, 1),
        "a new window starts from zero"
    );
    let d = b.rate_limit_hit("pol_1:p-1", 3600, 5, now).await.unwrap();
    assert_eq!(d.count, 1, "another window length is another counter");

    // Ended windows are swept.
    assert_eq!(a.sweep_rate_limits(window_start + 60_000).await.unwrap(), 2);
    assert!(a.rate_limit_hit("k", 0, 1, now).await.is_err());
}

async fn rate_limit_counts_concurrent_hits(db: TestDatabase) {
    let a = open(&db).await;
    let b = db.store().await;
    let mut tasks = Vec::new();
    for i in 0..40 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            store.rate_limit_hit("burst", 60, 25, T0).await.unwrap()
        }));
    }
    let mut counts = Vec::new();
    let mut allowed = 0;
    for t in tasks {
        let d = t.await.unwrap();
        counts.push(d.count);
        allowed += usize::from(d.allowed);
    }
    counts.sort_unstable();
    assert_eq!(
        counts,
        (1..=40).collect::<Vec<u64>>(),
        "every hit counted once"
    );
    assert_eq!(allowed, 25);
}
