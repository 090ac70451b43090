use std::collections::BTreeSet;

use manifold_store::{
    Action, AuthError, DEFAULT_TOKEN_LIFETIME, Expiry, NewToken, SWEEP_BATCH, StoreError,
    token_id_of,
};
use manifold_test_postgres::{TestDatabase, on_both_backends};

use crate::{HOUR, T0, open};

on_both_backends!(
    create_and_authenticate,
    authenticate_refusals,
    list_revoke_delete,
    sweep_deletes_in_bounded_passes,
    sweep_takes_the_oldest_expiries_first,
    token_groups,
);

async fn create_and_authenticate(db: TestDatabase) {
    let store = open(&db).await;
    let (record, bearer) = store
        .create_token_at(
            NewToken::new(
                "ci",
                [Action::Discover, Action::Call],
                ["github__*", "files__read_*"],
            ),
            T0,
        )
        .await
        .unwrap();

    // mfd_<12 hex>_<43 url-safe chars>
    let rest = bearer.strip_prefix("mfd_").unwrap();
    let (id, secret) = rest.split_once('_').unwrap();
    assert_eq!(id, record.id);
    assert_eq!(id.len(), 12);
    assert_eq!(secret.len(), 43);
    assert_eq!(token_id_of(&bearer), Some(id));

    let lifetime = DEFAULT_TOKEN_LIFETIME.as_millis() as i64;
    assert_eq!(record.expires_at, Some(T0 + lifetime));
    assert_eq!(record.created_at, T0);

    let authed = store.authenticate(&bearer, T0 + 1).await.unwrap();
    assert_eq!(authed, record);
    assert!(authed.allows(Action::Call));
    assert!(!authed.allows(Action::Admin));
    assert!(authed.scope_allows("github__create_issue"));
    assert!(authed.scope_allows("files__read_file"));
    assert!(!authed.scope_allows("files__write_file"));

    // Only the hash of the secret is stored.
    let listed = store.list_tokens().await.unwrap();
    assert_eq!(listed, vec![record.clone()]);
    assert!(!format!("{listed:?}").contains(secret));

    // Never expiring only when asked.
    let (forever, _) = store
        .create_token_at(
            NewToken::new("ops", [Action::Admin], ["*"]).expiry(Expiry::Never),
            T0,
        )
        .await
        .unwrap();
    assert_eq!(forever.expires_at, None);

    // Bad input is refused.
    for bad in [
        NewToken::new("", [Action::Call], ["*"]),
        NewToken::new("x", [], ["*"]),
        NewToken::new("x", [Action::Call], ["has space"]),
        NewToken::new("x", [Action::Call], ["*"]).expiry(Expiry::At(T0 - 1)),
    ] {
        let err = store.create_token_at(bad, T0).await.unwrap_err();
        assert!(matches!(err, StoreError::Invalid { .. }), "{err}");
    }
}

async fn authenticate_refusals(db: TestDatabase) {
    let store = open(&db).await;
    let (_, bearer) = store
        .create_token_at(
            NewToken::new("short", [Action::Call], ["*"])
                .expiry(Expiry::After(std::time::Duration::from_secs(3600))),
            T0,
        )
        .await
        .unwrap();
    let (revoked, revoked_bearer) = store
        .create_token_at(NewToken::new("gone", [Action::Call], ["*"]), T0)
        .await
        .unwrap();
    assert!(store.revoke_token(&revoked.id).await.unwrap());
    assert!(
        !store.revoke_token(&revoked.id).await.unwrap(),
        "second revoke is a no-op"
    );

    // Malformed.
    for bad in [
        "",
        "mfd_",
        "not-a-token",
        "mfd_zzzzzzzzzzzz_secret",
        &format!("Bearer {bearer}"),
        &bearer[..bearer.len() - 1],
        &format!("{bearer}x"),
    ] {
        let err = store.authenticate(bad, T0).await.unwrap_err();
        assert!(matches!(err, AuthError::Malformed), "{bad:?}: {err}");
        assert_eq!(err.reason(), "malformed");
    }

    // Unknown: a well-formed id that does not exist, and a wrong secret for
    // an id that does.
    let id = token_id_of(&bearer).unwrap();
    let secret = &bearer[4 + 12 + 1..];
    let unknown_id = format!("mfd_{}_{secret}", "0".repeat(12));
    let mut wrong_secret = secret.to_string();
    let flipped = if wrong_secret.starts_with('A') {
        "B"
    } else {
        "A"
    };
    wrong_secret.replace_range(0..1, flipped);
    let wrong_secret = format!("mfd_{id}_{wrong_secret}");
    for bad in [&unknown_id, &wrong_secret] {
        let err = store.authenticate(bad, T0).await.unwrap_err();
        assert!(matches!(err, AuthError::Unknown), "{bad}: {err}");
    }

    // Expired: at and after expires_at, not before.
    store.authenticate(&bearer, T0 + HOUR - 1).await.unwrap();
    for at in [T0 + HOUR, T0 + 2 * HOUR] {
        let err = store.authenticate(&bearer, at).await.unwrap_err();
        assert!(matches!(err, AuthError::Expired), "{err}");
    }

    // Revoked.
    let err = store.authenticate(&revoked_bearer, T0).await.unwrap_err();
    assert!(matches!(err, AuthError::Revoked), "{err}");
    assert_eq!(err.reason(), "revoked");
}

async fn list_revoke_delete(db: TestDatabase) {
    let store = open(&db).await;
    let mut ids = Vec::new();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        let (record, _) = store
            .create_token_at(
                NewToken::new(name, [Action::Discover], ["*"]),
                T0 + i as i64,
            )
            .await
            .unwrap();
        ids.push(record.id);
    }
    let names: Vec<String> = store
        .list_tokens()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["a", "b", "c"]);

    assert!(store.revoke_token(&ids[1]).await.unwrap());
    let b = store.get_token(&ids[1]).await.unwrap().unwrap();
    assert!(b.is_revoked());
    assert!(!store.revoke_token("000000000000").await.unwrap());

    assert!(store.delete_token(&ids[0]).await.unwrap());
    assert!(!store.delete_token(&ids[0]).await.unwrap());
    assert_eq!(store.get_token(&ids[0]).await.unwrap(), None);
    assert_eq!(store.list_tokens().await.unwrap().len(), 2);
}

async fn sweep_deletes_in_bounded_passes(db: TestDatabase) {
    let store = open(&db).await;
    let started = std::time::Instant::now();
    // 1,200 tokens that expired at distinct instants before `now`.
    let now = T0 + 10_000 * HOUR;
    for i in 0..1200i64 {
        let created = T0 + i;
        store
            .create_token_at(
                NewToken::new(format!("old-{i}"), [Action::Call], ["*"])
                    .expiry(Expiry::At(created + HOUR)),
                created,
            )
            .await
            .unwrap();
    }
    // Survivors: unexpired, expiring exactly after now, and never expiring.
    let mut survivors = BTreeSet::new();
    for i in 0..10 {
        let (t, _) = store
            .create_token_at(
                NewToken::new(format!("live-{i}"), [Action::Call], ["*"])
                    .expiry(Expiry::At(now + 1 + i)),
                T0,
            )
            .await
            .unwrap();
        survivors.insert(t.id);
    }
    for i in 0..5 {
        let (t, _) = store
            .create_token_at(
                NewToken::new(format!("forever-{i}"), [Action::Call], ["*"]).expiry(Expiry::Never),
                T0,
            )
            .await
            .unwrap();
        survivors.insert(t.id);
    }
    let created_in = started.elapsed();

    // Passes of at most SWEEP_BATCH: 500, 500, 200.
    assert_eq!(SWEEP_BATCH, 500);
    let passes = store.sweep_all_expired(now).await.unwrap();
    assert_eq!(passes, vec![500, 500, 200]);

    let remaining: BTreeSet<String> = store
        .list_tokens()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(remaining, survivors);
    assert_eq!(
        store.sweep_all_expired(now).await.unwrap(),
        Vec::<usize>::new()
    );
    eprintln!(
        "[{}] created 1,215 tokens in {created_in:?}; swept 1,200 in {:?} total",
        db.backend(),
        started.elapsed() - created_in
    );
}

async fn sweep_takes_the_oldest_expiries_first(db: TestDatabase) {
    let store = open(&db).await;
    let now = T0 + 10_000 * HOUR;
    // Created in shuffled expiry order, so insertion order is not the answer.
    for i in 0..520i64 {
        let expires = T0 + HOUR + (i * 7919) % 520;
        store
            .create_token_at(
                NewToken::new(format!("old-{i}"), [Action::Call], ["*"])
                    .expiry(Expiry::At(expires)),
                T0,
            )
            .await
            .unwrap();
    }
    assert_eq!(store.sweep_expired_tokens(now).await.unwrap(), 500);
    let mut left: Vec<i64> = store
        .list_tokens()
        .await
        .unwrap()
        .into_iter()
        .filter_map(|t| t.expires_at)
        .collect();
    left.sort_unstable();
    let expected: Vec<i64> = (500..520).map(|i| T0 + HOUR + i).collect();
    assert_eq!(left, expected, "the 500 earliest expiries went first");
    assert_eq!(store.sweep_expired_tokens(now).await.unwrap(), 20);
    assert_eq!(store.sweep_expired_tokens(now).await.unwrap(), 0);
}

async fn token_groups(db: TestDatabase) {
    let store = open(&db).await;
    let (t, _) = store
        .create_token_at(NewToken::new("a", [Action::Call], ["*"]), T0)
        .await
        .unwrap();
    store.add_token_group(&t.id, "ops").await.unwrap();
    store.add_token_group(&t.id, "dev").await.unwrap();
    store.add_token_group(&t.id, "ops").await.unwrap(); // idempotent
    assert_eq!(store.token_groups(&t.id).await.unwrap(), ["dev", "ops"]);
    assert!(store.remove_token_group(&t.id, "dev").await.unwrap());
    assert_eq!(store.token_groups(&t.id).await.unwrap(), ["ops"]);

    let err = store
        .add_token_group("000000000000", "ops")
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
    let err = store.add_token_group(&t.id, "bad group").await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err}");

    // Memberships go with the token.
    store.delete_token(&t.id).await.unwrap();
    assert!(store.token_groups(&t.id).await.unwrap().is_empty());
}

/// Scopes match on the (server, tool) pair. Every scope shape a stored token
/// can hold keeps the matches it had when scopes were globs over the joined
/// name, except the one that crossed the separator.
#[test]
fn scopes_match_the_server_and_tool_pair_and_keep_their_meaning() {
    use manifold_store::{glob_match, scope_matches};
    let names = [
        "github__create_issue",
        "github__list_issues",
        "gitlab__create_issue",
        "files__read_file",
        "files__write_file",
        "time__get_current_time",
        "a__x",
        "a___x",            // server `a`, tool `_x`
        "get_current_time", // an unqualified (single-server) name
    ];
    let scopes = [
        "*",
        "github__*",
        "github__create_*",
        "git*",
        "*__read_*",
        "*__*_issue*",
        "files__read_file",
        "time__*",
        "a__*",
        "get_*",
        "?ime__*",
    ];
    for scope in scopes {
        for name in names {
            assert_eq!(
                scope_matches(scope, name),
                glob_match(scope, name),
                "{scope} on {name}: a stored scope changed its meaning"
            );
        }
    }
    // The one case that changes: a tool glob that starts where the server
    // glob ends no longer reaches into the server's name. `a_*__x` is the
    // scope for server `a_…`, never for server `a`'s tool `_x`.
    assert!(glob_match("a_*__x", "a___x"));
    assert!(!scope_matches("a_*__x", "a___x"));
    // And a scope for one server never reaches another whose name extends it.
    assert!(!scope_matches("a__*", "ab__x"));
}
