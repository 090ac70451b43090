use manifold_store::oauth::Sealer;
use manifold_test_postgres::{TestDatabase, on_both_backends};

use crate::{T0, open};

on_both_backends!(
    oauth_secrets_are_sealed_versioned_and_leased,
    a_pending_sign_in_is_taken_once_and_expires,
    a_pending_sign_in_keeps_its_link_and_browser_binding
);

async fn a_pending_sign_in_keeps_its_link_and_browser_binding(db: TestDatabase) {
    use manifold_store::oauth::PendingSignIn;
    let store = open(&db).await;
    let sealer = Sealer::new(Sealer::generate_secret().as_bytes()).unwrap();
    store
        .save_oauth_pending(&sealer, "csrf-1", "tracker", "user:alice", b"v", T0)
        .await
        .unwrap();
    let mut expected = PendingSignIn {
        server: "tracker".into(),
        principal: "user:alice".into(),
        authorize_url: None,
        binding: None,
    };
    let read = |now| store.oauth_pending_sign_in("csrf-1", now, 600_000);
    assert_eq!(read(T0).await.unwrap(), Some(expected.clone()));
    assert!(
        store
            .link_oauth_pending("csrf-1", "https://as.example/authorize?state=csrf-1")
            .await
            .unwrap()
    );
    assert!(store.bind_oauth_pending("csrf-1", "hash-a").await.unwrap());
    assert!(store.bind_oauth_pending("csrf-1", "hash-b").await.unwrap());
    expected.authorize_url = Some("https://as.example/authorize?state=csrf-1".into());
    expected.binding = Some("hash-b".into());
    assert_eq!(read(T0 + 1).await.unwrap(), Some(expected));
    // Expired or unknown: nothing to bind to.
    assert_eq!(read(T0 + 700_000).await.unwrap(), None);
    assert!(!store.bind_oauth_pending("csrf-9", "hash").await.unwrap());
    // The secret still opens: the new columns are outside the sealed value.
    assert_eq!(
        store
            .oauth_pending(&sealer, "csrf-1", T0 + 1, 600_000)
            .await
            .unwrap()
            .map(|(_, _, plain)| plain),
        Some(b"v".to_vec())
    );
}

async fn oauth_secrets_are_sealed_versioned_and_leased(db: TestDatabase) {
    let store = open(&db).await;
    let sealer = Sealer::new(Sealer::generate_secret().as_bytes()).unwrap();
    assert!(
        store
            .oauth_credentials(&sealer, "tracker", "")
            .await
            .unwrap()
            .is_none()
    );
    // No row yet: nothing to lease.
    assert!(
        !store
            .take_oauth_lease("tracker", "", "a", T0, T0 + 30_000)
            .await
            .unwrap()
    );

    let v1 = store
        .save_oauth_credentials(&sealer, "tracker", "", br#"{"refresh_token":"rt-1"}"#, T0)
        .await
        .unwrap();
    let v2 = store
        .save_oauth_credentials(
            &sealer,
            "tracker",
            "",
            br#"{"refresh_token":"rt-2"}"#,
            T0 + 1,
        )
        .await
        .unwrap();
    assert_eq!((v1, v2), (1, 2));
    let kept = store
        .oauth_credentials(&sealer, "tracker", "")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.plain, br#"{"refresh_token":"rt-2"}"#);
    assert_eq!(kept.version, 2);
    // Per principal, apart from the shared row.
    store
        .save_oauth_credentials(&sealer, "tracker", "user:alice", b"alice's", T0)
        .await
        .unwrap();
    assert_eq!(
        store
            .oauth_credentials(&sealer, "tracker", "user:alice")
            .await
            .unwrap()
            .unwrap()
            .plain,
        b"alice's"
    );
    // Another key cannot open them.
    let other = Sealer::new(Sealer::generate_secret().as_bytes()).unwrap();
    assert!(
        store
            .oauth_credentials(&other, "tracker", "")
            .await
            .is_err()
    );

    // One replica at a time holds the refresh lease; it runs out.
    assert!(
        store
            .take_oauth_lease("tracker", "", "a", T0, T0 + 30_000)
            .await
            .unwrap()
    );
    assert!(
        !store
            .take_oauth_lease("tracker", "", "b", T0 + 1, T0 + 30_001)
            .await
            .unwrap()
    );
    assert!(
        store
            .take_oauth_lease("tracker", "", "b", T0 + 30_000, T0 + 60_000)
            .await
            .unwrap()
    );
    store.release_oauth_lease("tracker", "", "a").await.unwrap();
    assert!(
        !store
            .take_oauth_lease("tracker", "", "a", T0 + 30_001, T0 + 60_001)
            .await
            .unwrap()
    );
    store.release_oauth_lease("tracker", "", "b").await.unwrap();
    assert!(
        store
            .take_oauth_lease("tracker", "", "a", T0 + 30_002, T0 + 60_002)
            .await
            .unwrap()
    );
    // A save keeps the lease with its holder.
    store
        .save_oauth_credentials(&sealer, "tracker", "", b"rt-3", T0 + 30_003)
        .await
        .unwrap();
    assert!(
        !store
            .take_oauth_lease("tracker", "", "b", T0 + 30_004, T0 + 60_004)
            .await
            .unwrap()
    );

    assert!(store.clear_oauth_credentials("tracker", "").await.unwrap());
    assert!(
        store
            .oauth_credentials(&sealer, "tracker", "")
            .await
            .unwrap()
            .is_none()
    );

    store
        .save_oauth_client(&sealer, "tracker", b"client-1", T0)
        .await
        .unwrap();
    store
        .save_oauth_client(&sealer, "tracker", b"client-2", T0)
        .await
        .unwrap();
    assert_eq!(
        store
            .oauth_client(&sealer, "tracker")
            .await
            .unwrap()
            .unwrap(),
        b"client-2"
    );
    assert!(store.oauth_client(&sealer, "wiki").await.unwrap().is_none());
}

async fn a_pending_sign_in_is_taken_once_and_expires(db: TestDatabase) {
    let store = open(&db).await;
    let sealer = Sealer::new(Sealer::generate_secret().as_bytes()).unwrap();
    store
        .save_oauth_pending(&sealer, "csrf-1", "tracker", "", b"verifier-1", T0)
        .await
        .unwrap();
    store
        .save_oauth_pending(&sealer, "csrf-2", "tracker", "user:bob", b"verifier-2", T0)
        .await
        .unwrap();
    // Read by whichever replica gets the callback...
    assert_eq!(
        store
            .oauth_pending(&sealer, "csrf-1", T0 + 1_000, 600_000)
            .await
            .unwrap(),
        Some(("tracker".into(), String::new(), b"verifier-1".to_vec()))
    );
    // ...and ended once used: a second callback finds nothing.
    assert_eq!(store.delete_oauth_pending("csrf-1", None).await.unwrap(), 1);
    assert_eq!(
        store
            .oauth_pending(&sealer, "csrf-1", T0 + 1_000, 600_000)
            .await
            .unwrap(),
        None
    );
    // Too old: not handed out, and swept.
    assert_eq!(
        store
            .oauth_pending(&sealer, "csrf-2", T0 + 700_000, 600_000)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .delete_oauth_pending("", Some(T0 + 600_000))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .oauth_pending(&sealer, "csrf-2", T0, 600_000)
            .await
            .unwrap(),
        None
    );
    // Another key cannot open a pending sign-in.
    store
        .save_oauth_pending(&sealer, "csrf-3", "tracker", "", b"v", T0)
        .await
        .unwrap();
    let other = Sealer::new(Sealer::generate_secret().as_bytes()).unwrap();
    assert!(
        store
            .oauth_pending(&other, "csrf-3", T0, 600_000)
            .await
            .is_err()
    );
}
