use std::collections::BTreeSet;

use manifold_store::{
    Action, Effect, NewPolicy, NewToken, PrincipalSelector, RiskTier, StoreError, TierSelector,
    ToolStatus,
};
use manifold_test_postgres::{TestDatabase, on_both_backends};

use crate::{T0, open};

on_both_backends!(policy_crud, load_policy_inputs_is_constant_in_catalog_size);

async fn policy_crud(db: TestDatabase) {
    let store = open(&db).await;
    let deny = store
        .create_policy(NewPolicy {
            principal: PrincipalSelector::Group("contractors".into()),
            server_glob: "github".into(),
            tool_glob: "delete_*".into(),
            tier: TierSelector::Only(RiskTier::Destructive),
            effect: Effect::Deny,
            description: "no deletes for contractors".into(),
        })
        .await
        .unwrap();
    assert!(deny.id.starts_with("pol_"));
    let limit = store
        .create_policy(NewPolicy {
            principal: PrincipalSelector::Token("0123456789ab".into()),
            ..NewPolicy::new(Effect::RateLimit {
                limit: 10,
                window_seconds: 60,
            })
        })
        .await
        .unwrap();
    let approve = store
        .create_policy(NewPolicy {
            tier: TierSelector::Only(RiskTier::Write),
            ..NewPolicy::new(Effect::RequireApproval)
        })
        .await
        .unwrap();
    let allow = store
        .create_policy(NewPolicy::new(Effect::Allow))
        .await
        .unwrap();

    assert_eq!(
        store.get_policy(&deny.id).await.unwrap().as_ref(),
        Some(&deny)
    );
    assert_eq!(
        store.get_policy(&limit.id).await.unwrap().as_ref(),
        Some(&limit)
    );
    let ids: BTreeSet<String> = store
        .list_policies()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(
        ids,
        [&deny, &limit, &approve, &allow]
            .iter()
            .map(|p| p.id.clone())
            .collect()
    );

    assert!(deny.matches_tool("github", "delete_repo", Some(RiskTier::Destructive)));
    assert!(!deny.matches_tool("github", "delete_repo", None));
    assert!(!deny.matches_tool("gitlab", "delete_repo", Some(RiskTier::Destructive)));
    let contractors: BTreeSet<String> = ["contractors".to_string()].into();
    assert!(deny.principal.matches(None, None, &contractors));
    assert!(
        !deny
            .principal
            .matches(None, Some("contractors"), &BTreeSet::new())
    );
    let alice: PrincipalSelector = "user:alice".parse().unwrap();
    assert_eq!(alice, PrincipalSelector::User("alice".into()));
    assert_eq!(alice.to_string(), "user:alice");
    assert!(alice.matches(None, Some("alice"), &BTreeSet::new()));
    assert!(!alice.matches(Some("alice"), None, &contractors));
    assert!("user:".parse::<PrincipalSelector>().is_err());

    // Update keeps id and creation time.
    let updated = store
        .update_policy(
            &limit.id,
            NewPolicy {
                description: "burst".into(),
                ..NewPolicy::new(Effect::RateLimit {
                    limit: 3,
                    window_seconds: 1,
                })
            },
        )
        .await
        .unwrap();
    assert_eq!(updated.id, limit.id);
    assert_eq!(updated.created_at, limit.created_at);
    assert_eq!(
        updated.effect,
        Effect::RateLimit {
            limit: 3,
            window_seconds: 1
        }
    );
    assert_eq!(updated.principal, PrincipalSelector::Everyone);
    assert_eq!(store.get_policy(&limit.id).await.unwrap(), Some(updated));

    let err = store
        .update_policy("pol_nope", NewPolicy::new(Effect::Allow))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
    let err = store
        .create_policy(NewPolicy::new(Effect::RateLimit {
            limit: 0,
            window_seconds: 60,
        }))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err}");
    let err = store
        .create_policy(NewPolicy {
            tool_glob: String::new(),
            ..NewPolicy::new(Effect::Allow)
        })
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err}");

    assert!(store.delete_policy(&approve.id).await.unwrap());
    assert!(!store.delete_policy(&approve.id).await.unwrap());
    assert_eq!(store.list_policies().await.unwrap().len(), 3);
}

/// Adds tools `from..to` on a few servers, classified.
async fn add_tools(store: &manifold_store::Store, from: usize, to: usize) {
    for i in from..to {
        let server = format!("server{}", i % 7);
        let tool = format!("tool_{i}");
        store
            .observe_tool(&server, &tool, &format!("h{i}"), ToolStatus::Approved, T0)
            .await
            .unwrap();
        if i % 3 == 0 {
            store
                .classify_tool(&server, &tool, Some(RiskTier::Write))
                .await
                .unwrap();
        }
    }
}

async fn load_policy_inputs_is_constant_in_catalog_size(db: TestDatabase) {
    let store = open(&db).await;
    for i in 0..5 {
        let (t, _) = store
            .create_token_at(NewToken::new(format!("t{i}"), [Action::Call], ["*"]), T0)
            .await
            .unwrap();
        store.add_token_group(&t.id, "ops").await.unwrap();
        if i % 2 == 0 {
            store.add_token_group(&t.id, "dev").await.unwrap();
        }
    }
    for i in 0..4 {
        store
            .create_policy(NewPolicy {
                server_glob: format!("server{i}"),
                ..NewPolicy::new(Effect::Allow)
            })
            .await
            .unwrap();
    }

    add_tools(&store, 0, 50).await;
    let before = store.statements();
    let small = store.load_policy_inputs().await.unwrap();
    let small_statements = store.statements() - before;
    assert_eq!(small.classifications.len(), 50);

    add_tools(&store, 50, 500).await;
    let before = store.statements();
    let large = store.load_policy_inputs().await.unwrap();
    let large_statements = store.statements() - before;
    assert_eq!(large.classifications.len(), 500);

    assert_eq!(
        small_statements, large_statements,
        "statement count must not grow with the catalog"
    );
    assert_eq!(large_statements, 3, "one statement per table");
    assert_eq!(large.policies.len(), 4);
    assert_eq!(large.token_groups.len(), 5);
    assert!(large.token_groups.values().all(|g| g.contains("ops")));
    assert_eq!(
        large
            .token_groups
            .values()
            .filter(|g| g.contains("dev"))
            .count(),
        3
    );
    let (some_token, _) = large.token_groups.iter().next().unwrap();
    assert!(large.groups_of(some_token).contains("ops"));
    assert!(large.groups_of("nobody").is_empty());
    assert_eq!(
        large
            .classifications
            .iter()
            .filter(|c| c.tier == Some(RiskTier::Write))
            .count(),
        167
    );
    eprintln!(
        "[{}] load_policy_inputs: {small_statements} statements for 50 tools, {large_statements} for 500",
        db.backend()
    );
}
