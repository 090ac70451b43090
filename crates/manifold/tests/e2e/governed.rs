//! The governed gateway end to end on each backend: a real `manifold serve`
//! whose store is SQLite or a throwaway PostgreSQL, tokens and approvals from
//! the real CLI, a real MCP client over HTTP. (The Python suite does the same
//! with npm's server-memory upstream on SQLite.)

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use manifold_test_postgres::{TestDatabase, on_both_backends};
use serde_json::{Value, json};

on_both_backends!(governed_gateway_end_to_end);

fn catalog(dir: &std::path::Path) -> std::path::PathBuf {
    let schema = json!({"type": "object", "properties": {"path": {"type": "string"}}});
    let rows = [
        ("read", "Read a file.", json!({"readOnlyHint": true})),
        (
            "write",
            "Write a file.",
            json!({"readOnlyHint": false, "destructiveHint": false}),
        ),
        (
            "delete",
            "Delete a file.",
            json!({"readOnlyHint": false, "destructiveHint": true}),
        ),
    ];
    write_files_catalog(dir, &schema, &rows)
}

async fn governed_gateway_end_to_end(db: TestDatabase) {
    let dir = tempfile::tempdir().unwrap();
    let files = fixture_server("files", &catalog(dir.path()), &[], "");
    let gw = GatewayProcess::start(&format!(
        "[gateway]\nmode = \"direct\"\n\n[auth]\nrequired = true\n\n\
         [store]\ndatabase_url = {:?}\n\n[governance]\napproval_wait_seconds = 30\n\n\
         [[policies]]\nprincipal = \"group:readers\"\ntier = \"write\"\neffect = \"deny\"\n\n\
         [[policies]]\nprincipal = \"group:readers\"\ntier = \"destructive\"\neffect = \"deny\"\n\n\
         [[policies]]\ntier = \"destructive\"\neffect = \"require_approval\"\n\n{files}",
        db.url()
    ));
    let config = gw.dir.path().join("manifold.toml");
    let reader: Value = serde_json::from_str(&cli(
        &config,
        &[
            "token", "create", "--name", "reader", "--group", "readers", "--json",
        ],
    ))
    .unwrap();
    let agent: Value = serde_json::from_str(&cli(
        &config,
        &["token", "create", "--name", "agent", "--json"],
    ))
    .unwrap();

    let anonymous = reqwest::Client::new()
        .post(&gw.url)
        .header("content-type", "application/json")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    let challenge = anonymous.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(challenge.contains("resource_metadata="), "{challenge}");

    // A read-only token sees and calls only the read-only tool.
    let client = connect(&gw.url, reader["token"].as_str()).await;
    let names: Vec<String> = client
        .peer()
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(names, ["files__read"]);
    let read = call(&client, "files__read", json!({"path": "/a"})).await;
    assert_ne!(read.is_error, Some(true), "{}", text(&read));
    let refused = call(&client, "files__write", json!({"path": "/a"})).await;
    assert_eq!(
        refused.structured_content.as_ref().unwrap()["error"],
        "denied"
    );
    client.cancel().await.unwrap();

    // A destructive call waits until an operator approves it from the CLI.
    let client = connect(&gw.url, agent["token"].as_str()).await;
    let waiting = tokio::spawn(async move {
        let result = call(&client, "files__delete", json!({"path": "/tmp/x"})).await;
        client.cancel().await.unwrap();
        result
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let pending = loop {
        let pending: Vec<Value> =
            serde_json::from_str(&cli(&config, &["approvals", "list", "--json"])).unwrap();
        if let Some(first) = pending.into_iter().next() {
            break first;
        }
        assert!(Instant::now() < deadline, "no approval request appeared");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(pending["tool"], "files__delete");
    assert!(!waiting.is_finished(), "the call waits");
    cli(
        &config,
        &[
            "approvals",
            "approve",
            pending["id"].as_str().unwrap(),
            "--by",
            "test",
        ],
    );
    let released = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_ne!(released.is_error, Some(true), "{}", text(&released));

    // The audit has all of it.
    let activity: Vec<Value> =
        cli_until(&config, &["audit", "export", "--kind", "activity"], |out| {
            out.contains("\"decision\":\"approved\"")
        })
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seen: Vec<(String, String)> = activity
        .iter()
        .map(|r| {
            (
                r["tool"].as_str().unwrap().to_string(),
                r["decision"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for want in [
        ("files__read", "allowed"),
        ("files__write", "denied"),
        ("files__delete", "approved"),
    ] {
        assert!(
            seen.contains(&(want.0.to_string(), want.1.to_string())),
            "{want:?} not in {seen:?}"
        );
    }
    let discovery = cli(
        &config,
        &["audit", "tail", "--kind", "discovery", "-n", "50"],
    );
    assert!(
        discovery.contains(reader["id"].as_str().unwrap()),
        "{discovery}"
    );
    assert!(
        !discovery.contains("files__read"),
        "names are never stored: {discovery}"
    );
}
