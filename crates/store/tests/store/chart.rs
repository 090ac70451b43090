use manifold_store::{
    ActivityEvent, AuditRow, CHART_BUCKET_MS, CHART_BUCKETS, CallBucket, CallOutcome, Decision,
    hash_arguments,
};
use manifold_test_postgres::{TestDatabase, on_both_backends};
use serde_json::json;

use crate::{HOUR, T0, commit_row, open};

on_both_backends!(
    chart_counts_calls_errors_refusals_and_the_median_per_minute,
    latest_call_is_the_callers_newest_row_for_the_tool,
);

fn row(at: i64, tool: &str, outcome: CallOutcome, latency_ms: u64) -> ActivityEvent {
    ActivityEvent {
        at,
        principal: "p".to_string(),
        token_id: None,
        tool: tool.to_string(),
        args_hash: hash_arguments(&json!({})),
        decision: if outcome == CallOutcome::NotForwarded {
            Decision::Denied
        } else {
            Decision::Allowed
        },
        approval_id: None,
        outcome,
        latency_ms,
        bytes_in: 0,
        bytes_out: 0,
        details: json!({}),
    }
}

async fn chart_counts_calls_errors_refusals_and_the_median_per_minute(db: TestDatabase) {
    let store = open(&db).await;
    let now = T0 + 30_000;
    let empty = store.call_chart("files__", now).await.unwrap();
    assert_eq!(empty.buckets.len(), CHART_BUCKETS);
    assert!(
        empty
            .buckets
            .iter()
            .all(|b| b.calls == 0 && b.p50_ms.is_none())
    );
    assert_eq!(
        empty.buckets[CHART_BUCKETS - 1].start,
        T0,
        "the last bucket is this minute"
    );

    use CallOutcome::*;
    let rows = [
        // This minute: four forwarded (one failed) and one refused.
        row(T0 + 1, "files__read", Success, 10),
        row(T0 + 2, "files__read", Success, 30),
        row(T0 + 3, "files__write", Success, 20),
        row(T0 + 4, "files__read", Error, 50),
        row(T0 + 5, "files__write", NotForwarded, 1),
        // The minute before.
        row(T0 - CHART_BUCKET_MS + 5, "files__read", Success, 7),
        // Other servers, one whose name only starts like it.
        row(T0 + 6, "notes__list", Success, 99),
        row(T0 + 7, "filesystem__read", Success, 99),
        // Outside the hour, on both sides.
        row(T0 - HOUR, "files__read", Success, 99),
        row(T0 + 2 * CHART_BUCKET_MS, "files__read", Success, 99),
    ];
    for r in &rows {
        commit_row(&store, AuditRow::Activity(r.clone())).await;
    }
    let statements = store.statements();
    let chart = store.call_chart("files__", now).await.unwrap();
    assert_eq!(store.statements() - statements, 1, "one statement");
    assert!(!chart.truncated);
    let last = chart.buckets[CHART_BUCKETS - 1];
    assert_eq!(
        last,
        CallBucket {
            start: T0,
            calls: 5,
            errors: 1,
            refused: 1,
            // Forwarded 10, 20, 30, 50: the lower middle.
            p50_ms: Some(20),
        }
    );
    let before = chart.buckets[CHART_BUCKETS - 2];
    assert_eq!((before.calls, before.p50_ms), (1, Some(7)));
    let total: u64 = chart.buckets.iter().map(|b| b.calls).sum();
    assert_eq!(total, 6, "{chart:?}");

    // An odd count takes the middle one; a refused-only minute has no median.
    commit_row(
        &store,
        AuditRow::Activity(row(T0 + 8, "files__read", Success, 40)),
    )
    .await;
    commit_row(
        &store,
        AuditRow::Activity(row(
            T0 - 2 * CHART_BUCKET_MS,
            "files__read",
            NotForwarded,
            3,
        )),
    )
    .await;
    let chart = store.call_chart("files__", now).await.unwrap();
    assert_eq!(chart.buckets[CHART_BUCKETS - 1].p50_ms, Some(30));
    let refused_only = chart.buckets[CHART_BUCKETS - 3];
    assert_eq!(
        (
            refused_only.calls,
            refused_only.refused,
            refused_only.p50_ms
        ),
        (1, 1, None)
    );

    // No prefix: every tool in the hour.
    let all = store.call_chart("", now).await.unwrap();
    let total: u64 = all.buckets.iter().map(|b| b.calls).sum();
    assert_eq!(total, 10, "{all:?}");
}

async fn latest_call_is_the_callers_newest_row_for_the_tool(db: TestDatabase) {
    let store = open(&db).await;
    assert_eq!(
        store.latest_call("p", "files__read", T0).await.unwrap(),
        None
    );
    commit_row(
        &store,
        AuditRow::Activity(row(T0 - 1, "files__read", CallOutcome::Success, 5)),
    )
    .await;
    commit_row(
        &store,
        AuditRow::Activity(row(T0 + 1, "files__read", CallOutcome::Error, 6)),
    )
    .await;
    let mut other = row(T0 + 2, "files__read", CallOutcome::Success, 7);
    other.principal = "someone-else".into();
    commit_row(&store, AuditRow::Activity(other)).await;
    commit_row(
        &store,
        AuditRow::Activity(row(T0 + 3, "files__write", CallOutcome::Success, 8)),
    )
    .await;
    let found = store
        .latest_call("p", "files__read", T0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found["kind"], "activity");
    assert_eq!(found["created_at"], T0 + 1);
    assert_eq!(found["outcome"], "error");
    assert_eq!(found["latency_ms"], 6);
}
