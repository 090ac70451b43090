use manifold_store::{HashCheck, RiskTier, StoreError, ToolObservation, ToolStatus};
use manifold_test_postgres::{TestDatabase, on_both_backends};

use crate::{T0, open};

on_both_backends!(quarantine_follows_definition_changes, classify_and_list);

async fn quarantine_follows_definition_changes(db: TestDatabase) {
    let store = open(&db).await;
    // New tools land in quarantine.
    let seen = store
        .observe_tool("github", "create_issue", "h1", ToolStatus::Quarantined, T0)
        .await
        .unwrap();
    let ToolObservation::New(c) = &seen else {
        panic!("{seen:?}")
    };
    assert_eq!(c.status, ToolStatus::Quarantined);
    assert_eq!(c.approved_hash, None);
    assert!(!c.is_callable());

    let again = store
        .observe_tool(
            "github",
            "create_issue",
            "h1",
            ToolStatus::Quarantined,
            T0 + 1,
        )
        .await
        .unwrap();
    assert!(matches!(again, ToolObservation::Unchanged(_)), "{again:?}");

    // Approval is of the reviewed definition only.
    let err = store
        .approve_tool("github", "create_issue", "h0")
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    let approved = store
        .approve_tool("github", "create_issue", "h1")
        .await
        .unwrap();
    assert!(approved.is_callable());
    assert_eq!(approved.approved_hash.as_deref(), Some("h1"));

    // The definition changes: detected and quarantined.
    assert_eq!(
        store
            .detect_hash_change("github", "create_issue", "h2")
            .await
            .unwrap(),
        HashCheck::Changed {
            stored_hash: "h1".into(),
            approved_hash: Some("h1".into())
        }
    );
    assert_eq!(
        store
            .detect_hash_change("github", "create_issue", "h1")
            .await
            .unwrap(),
        HashCheck::Same
    );
    assert_eq!(
        store
            .detect_hash_change("github", "nope", "h1")
            .await
            .unwrap(),
        HashCheck::Unknown
    );
    let changed = store
        .observe_tool(
            "github",
            "create_issue",
            "h2",
            ToolStatus::Quarantined,
            T0 + 2,
        )
        .await
        .unwrap();
    let ToolObservation::Changed {
        previous_hash,
        current,
    } = &changed
    else {
        panic!("{changed:?}")
    };
    assert_eq!(previous_hash, "h1");
    assert_eq!(current.definition_hash, "h2");
    assert_eq!(current.status, ToolStatus::Quarantined);
    assert!(!current.is_callable());
    assert_eq!(current.updated_at, T0 + 2);
    assert_eq!(current.first_seen_at, T0);

    // Back to the approved definition: released again.
    let back = store
        .observe_tool(
            "github",
            "create_issue",
            "h1",
            ToolStatus::Quarantined,
            T0 + 3,
        )
        .await
        .unwrap();
    assert!(back.classification().is_callable(), "{back:?}");

    // An operator's quarantine withdraws the approval for good.
    let q = store
        .quarantine_tool("github", "create_issue")
        .await
        .unwrap();
    assert_eq!(q.status, ToolStatus::Quarantined);
    assert_eq!(q.approved_hash, None);
    store
        .observe_tool(
            "github",
            "create_issue",
            "h2",
            ToolStatus::Quarantined,
            T0 + 4,
        )
        .await
        .unwrap();
    let back = store
        .observe_tool(
            "github",
            "create_issue",
            "h1",
            ToolStatus::Quarantined,
            T0 + 5,
        )
        .await
        .unwrap();
    assert!(!back.classification().is_callable());

    // Tools can also be trusted on first sight.
    let trusted = store
        .observe_tool("time", "now", "t1", ToolStatus::Approved, T0)
        .await
        .unwrap();
    assert!(trusted.classification().is_callable());

    let err = store.approve_tool("nope", "nope", "h").await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
    let err = store.quarantine_tool("nope", "nope").await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
}

async fn classify_and_list(db: TestDatabase) {
    let store = open(&db).await;
    for (server, tool) in [("b", "write"), ("a", "read"), ("a", "delete")] {
        store
            .observe_tool(server, tool, "h", ToolStatus::Quarantined, T0)
            .await
            .unwrap();
    }
    let c = store
        .classify_tool("a", "delete", Some(RiskTier::Destructive))
        .await
        .unwrap();
    assert_eq!(c.tier, Some(RiskTier::Destructive));
    store
        .classify_tool("a", "read", Some(RiskTier::ReadOnly))
        .await
        .unwrap();
    store
        .classify_tool("b", "write", Some(RiskTier::Write))
        .await
        .unwrap();
    let cleared = store.classify_tool("b", "write", None).await.unwrap();
    assert_eq!(cleared.tier, None);
    let err = store
        .classify_tool("x", "y", Some(RiskTier::Write))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");

    let listed: Vec<(String, String, Option<RiskTier>)> = store
        .list_tool_classifications()
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.server, c.tool, c.tier))
        .collect();
    assert_eq!(
        listed,
        [
            ("a".into(), "delete".into(), Some(RiskTier::Destructive)),
            ("a".into(), "read".into(), Some(RiskTier::ReadOnly)),
            ("b".into(), "write".into(), None),
        ]
    );
    let one = store
        .tool_classification("a", "read")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(one.tier, Some(RiskTier::ReadOnly));
}
