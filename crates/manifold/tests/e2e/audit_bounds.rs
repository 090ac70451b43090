//! What a caller can make the audit store: nothing is written before it is
//! allowed, and what is written of a caller's choosing is bounded. Measured
//! by SQL over the audit tables, on both backends.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use manifold_test_postgres::{TestDatabase, on_both_backends};
use serde_json::{Value, json};
use sqlx::Row;

on_both_backends!(sixteen_calls_naming_a_megabyte_tool_store_little_and_answer_fast);

/// The bytes of text in every audit row, by SQL.
async fn audit_text_bytes(url: &str) -> i64 {
    let sql = "SELECT CAST(\
        (SELECT COALESCE(SUM(LENGTH(principal) + LENGTH(COALESCE(token_id, '')) + LENGTH(tool) \
             + LENGTH(args_hash) + LENGTH(decision) + LENGTH(COALESCE(approval_id, '')) \
             + LENGTH(outcome) + LENGTH(details)), 0) FROM activity_audit) \
      + (SELECT COALESCE(SUM(LENGTH(COALESCE(principal, '')) + LENGTH(COALESCE(token_id, '')) \
             + LENGTH(outcome) + LENGTH(COALESCE(reason, '')) + LENGTH(details)), 0) FROM access_audit) \
      + (SELECT COALESCE(SUM(LENGTH(principal) + LENGTH(COALESCE(token_id, '')) \
             + LENGTH(visible_digest) + LENGTH(details)), 0) FROM discovery_audit) \
      AS BIGINT) AS bytes";
    query_i64(url, sql).await
}

async fn query_i64(url: &str, sql: &str) -> i64 {
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .unwrap();
    let row = sqlx::query(sql).fetch_one(&pool).await.unwrap();
    let value: i64 = row.try_get(0).unwrap();
    pool.close().await;
    value
}

/// A stateless `tools/call` of `name` with `bearer`.
async fn call_named(http: &reqwest::Client, url: &str, bearer: &str, name: &str) -> String {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": name, "arguments": {}}});
    let response = http
        .post(url)
        .bearer_auth(bearer)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    response.text().await.unwrap()
}

/// A direct-mode gateway with auth on, and the directory of its upstream's
/// catalog (keep it while the gateway runs).
fn gateway(db_url: Option<&str>, extra: &str) -> (GatewayProcess, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let catalog = write_catalog(
        dir.path(),
        "files.jsonl",
        &[(
            "files",
            "read_file",
            "Read a file.",
            json!({"type": "object"}),
        )],
    );
    let files = fixture_server("files", &catalog, &[], "");
    let store = db_url.map_or(String::new(), |url| {
        format!("[store]\ndatabase_url = {url:?}\n\n")
    });
    let gw = GatewayProcess::start(&format!(
        "[gateway]\nmode = \"direct\"\n\n[auth]\nrequired = true\n\n{store}{extra}\n\n{files}"
    ));
    (gw, dir)
}

fn token(gw: &GatewayProcess, actions: &[&str]) -> String {
    let mut args = vec!["token", "create", "--name", "agent", "--json"];
    for action in actions {
        args.extend(["--action", action]);
    }
    let created: Value =
        serde_json::from_str(&cli(&gw.dir.path().join("manifold.toml"), &args)).unwrap();
    created["token"].as_str().unwrap().to_string()
}

/// Sixteen calls naming a 1 MB tool, from a token that may discover and
/// call: each is answered within 2 s, and together they add at most
/// 16 KiB of text to the audit tables. Each row keeps the name cut at
/// 256 bytes, its length and its SHA-256.
async fn sixteen_calls_naming_a_megabyte_tool_store_little_and_answer_fast(db: TestDatabase) {
    let (gw, _catalog) = gateway(Some(db.url()), "");
    let bearer = token(&gw, &["discover", "call"]);
    let http = reqwest::Client::new();
    // The access row of a first request, so that what follows is calls only.
    call_named(&http, &gw.url, &bearer, "files__read_file").await;
    let config = gw.dir.path().join("manifold.toml");
    cli_until(&config, &["audit", "export", "--kind", "activity"], |out| {
        out.contains("files__read_file")
    });
    let before = audit_text_bytes(db.url()).await;

    let name = "x".repeat(1_000_000);
    for i in 0..16 {
        let started = Instant::now();
        let answer = call_named(&http, &gw.url, &bearer, &name).await;
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "call {i} took {took:?}");
        assert!(
            answer.len() < 4096,
            "the answer echoes {} bytes",
            answer.len()
        );
        assert!(answer.contains("(1000000 bytes)"), "{answer}");
    }
    let rows = cli_until(&config, &["audit", "export", "--kind", "activity"], |out| {
        out.matches("unknown_tool").count() >= 16
    });
    let unknown: Vec<Value> = rows
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["details"]["refusal"] == "unknown_tool")
        .collect();
    assert_eq!(unknown.len(), 16);
    for row in &unknown {
        assert_eq!(row["tool"].as_str().unwrap().len(), 256);
        assert_eq!(row["details"]["tool_bytes"], 1_000_000);
        assert_eq!(row["details"]["tool_sha256"].as_str().unwrap().len(), 64);
    }
    let added = audit_text_bytes(db.url()).await - before;
    assert!(
        added <= 16 * 1024,
        "the audit grew by {added} bytes of text"
    );
}

/// A token without `call`, or a caller past a principal-wide rate limit,
/// is refused before the name is looked up: no "unknown tool" answer, no
/// suggestions computed over what it named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_action_and_principal_limits_apply_before_the_name_is_looked_up() {
    let policy = "[[policies]]\nprincipal = \"*\"\neffect = \"rate_limit\"\nlimit = 2\n\
                  window_seconds = 60";
    let (gw, _catalog) = gateway(None, policy);
    let http = reqwest::Client::new();

    let discover_only = token(&gw, &["discover"]);
    let answer = call_named(&http, &gw.url, &discover_only, "files__nope").await;
    assert!(answer.contains("action_not_allowed"), "{answer}");
    assert!(!answer.contains("Unknown tool"), "{answer}");

    let caller = token(&gw, &["discover", "call"]);
    for _ in 0..2 {
        let answer = call_named(&http, &gw.url, &caller, "files__nope").await;
        assert!(answer.contains("Unknown tool"), "{answer}");
    }
    let answer = call_named(&http, &gw.url, &caller, "files__nope").await;
    assert!(answer.contains("rate_limited"), "{answer}");
    assert!(!answer.contains("Unknown tool"), "{answer}");
}
