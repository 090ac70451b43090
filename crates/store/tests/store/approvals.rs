use manifold_store::{ApprovalError, ApprovalStatus, hash_arguments, now_ms};
use manifold_test_postgres::{TestDatabase, on_both_backends};
use serde_json::json;

use crate::{HOUR, open};

on_both_backends!(
    approval_is_single_use_and_bound_to_its_arguments,
    approval_decisions
);

async fn approval_is_single_use_and_bound_to_its_arguments(db: TestDatabase) {
    let store = open(&db).await;
    let now = now_ms();
    let args = json!({"path": "/etc/passwd", "force": true});
    let args_hash = hash_arguments(&args);
    let id = store
        .create_approval(
            "p-1",
            "files__delete",
            &args_hash,
            &json!({"path": "/etc/passwd", "force": true}),
            now + HOUR,
        )
        .await
        .unwrap();

    // Not usable while pending.
    let err = store
        .consume_approval(&id, "p-1", "files__delete", &args_hash, now)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ApprovalError::NotApproved(ApprovalStatus::Pending)),
        "{err}"
    );

    let decided = store.decide_approval(&id, true, "alice").await.unwrap();
    assert_eq!(decided.status, ApprovalStatus::Approved);
    assert_eq!(decided.decided_by.as_deref(), Some("alice"));

    // Bound to the exact argument hash, tool and principal.
    let other_args = hash_arguments(&json!({"path": "/etc/shadow", "force": true}));
    for (principal, tool, hash) in [
        ("p-1", "files__delete", other_args.as_str()),
        ("p-2", "files__delete", args_hash.as_str()),
        ("p-1", "files__delete_all", args_hash.as_str()),
    ] {
        let err = store
            .consume_approval(&id, principal, tool, hash, now)
            .await
            .unwrap_err();
        assert!(matches!(err, ApprovalError::Mismatch), "{err}");
    }
    // Expired at its expiry instant.
    let err = store
        .consume_approval(&id, "p-1", "files__delete", &args_hash, now + HOUR)
        .await
        .unwrap_err();
    assert!(matches!(err, ApprovalError::Expired), "{err}");

    // The same arguments in another key order hash the same.
    let reordered = hash_arguments(&json!({"force": true, "path": "/etc/passwd"}));
    store
        .consume_approval(&id, "p-1", "files__delete", &reordered, now)
        .await
        .unwrap();

    // Single use.
    let err = store
        .consume_approval(&id, "p-1", "files__delete", &args_hash, now)
        .await
        .unwrap_err();
    assert!(matches!(err, ApprovalError::AlreadyConsumed), "{err}");
    assert!(
        store
            .get_approval(&id)
            .await
            .unwrap()
            .unwrap()
            .consumed_at
            .is_some()
    );

    // Racing consumers: exactly one wins.
    let id2 = store
        .create_approval("p-1", "files__delete", &args_hash, &json!({}), now + HOUR)
        .await
        .unwrap();
    store.decide_approval(&id2, true, "alice").await.unwrap();
    let other = db.store().await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let s = if i % 2 == 0 {
            store.clone()
        } else {
            other.clone()
        };
        let (id2, h) = (id2.clone(), args_hash.clone());
        tasks.push(tokio::spawn(async move {
            s.consume_approval(&id2, "p-1", "files__delete", &h, now)
                .await
        }));
    }
    let mut wins = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => wins += 1,
            Err(ApprovalError::AlreadyConsumed) => {}
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert_eq!(wins, 1);

    let err = store
        .consume_approval("apr_nope", "p-1", "t", &args_hash, now)
        .await
        .unwrap_err();
    assert!(matches!(err, ApprovalError::NotFound), "{err}");
}

async fn approval_decisions(db: TestDatabase) {
    let store = open(&db).await;
    let now = now_ms();
    let hash = hash_arguments(&json!({}));
    let a = store
        .create_approval("p", "t__a", &hash, &json!({"x": "[redacted]"}), now + HOUR)
        .await
        .unwrap();
    let b = store
        .create_approval("p", "t__b", &hash, &json!({}), now + HOUR)
        .await
        .unwrap();
    let expired = store
        .create_approval("p", "t__c", &hash, &json!({}), now - 1)
        .await
        .unwrap();

    // Both were created in the same millisecond, so their order is not asserted.
    let mut pending: Vec<String> = store
        .list_pending()
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    pending.sort();
    let mut want = [a.clone(), b.clone()];
    want.sort();
    assert_eq!(pending, want, "expired requests are not pending");
    let got = store.get_approval(&a).await.unwrap().unwrap();
    assert_eq!(got.redacted_args, json!({"x": "[redacted]"}));
    assert_eq!(got.status, ApprovalStatus::Pending);
    assert_eq!(got.tool, "t__a");

    let denied = store.decide_approval(&b, false, "bob").await.unwrap();
    assert_eq!(denied.status, ApprovalStatus::Denied);
    let err = store
        .decide_approval(&b, true, "mallory")
        .await
        .unwrap_err();
    assert!(
        matches!(err, ApprovalError::AlreadyDecided(ApprovalStatus::Denied)),
        "{err}"
    );
    let err = store
        .consume_approval(&b, "p", "t__b", &hash, now)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ApprovalError::NotApproved(ApprovalStatus::Denied)),
        "{err}"
    );

    let err = store
        .decide_approval(&expired, true, "bob")
        .await
        .unwrap_err();
    assert!(matches!(err, ApprovalError::Expired), "{err}");
    let err = store
        .decide_approval("apr_nope", true, "bob")
        .await
        .unwrap_err();
    assert!(matches!(err, ApprovalError::NotFound), "{err}");

    let pending: Vec<String> = store
        .list_pending()
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(pending, [a]);
    assert_eq!(store.sweep_expired_approvals(now).await.unwrap(), 1);
    assert!(store.get_approval(&expired).await.unwrap().is_none());
}
