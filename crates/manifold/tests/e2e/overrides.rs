//! Tool overrides (`[[servers.tools]]`) end to end on a real gateway and a
//! real fixture upstream: a renamed, re-described tool is found by its new
//! description and called by its new name (the upstream still gets its own
//! name, and the audit records it); a hidden tool cannot be reached by any
//! path; a deny policy written for the upstream's name still denies the
//! renamed tool; an override naming no tool is logged and shown.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

fn catalog(dir: &std::path::Path) -> std::path::PathBuf {
    let schema = json!({"type": "object", "properties": {"path": {"type": "string"}}});
    let rows = [
        ("read", "Read a file.", json!({"readOnlyHint": true})),
        ("stat", "Stat a file.", json!({"readOnlyHint": true})),
        (
            "delete",
            "Delete a file.",
            json!({"readOnlyHint": false, "destructiveHint": true}),
        ),
        (
            "purge",
            "Purge the trash.",
            json!({"readOnlyHint": false, "destructiveHint": false}),
        ),
    ];
    write_files_catalog(dir, &schema, &rows)
}

const OVERRIDES: &str = r#"
[[servers.tools]]
name = "read"
rename = "fetch_document"
description = "Fetch the archived contract text for a customer account."

[[servers.tools]]
name = "delete"
hidden = true

[[servers.tools]]
name = "purge"
rename = "tidy"

[[servers.tools]]
name = "archive"
description = "A tool this server does not have."
"#;

fn token(config: &std::path::Path, name: &str, extra: &[&str]) -> String {
    let mut args = vec!["token", "create", "--name", name, "--json"];
    args.extend(extra);
    let created: Value = serde_json::from_str(&cli(config, &args)).unwrap();
    created["token"].as_str().unwrap().to_string()
}

/// Waits (with a deadline) for a gateway log line holding `needle`.
fn logged(gw: &GatewayProcess, needle: &str) -> String {
    if let Some(line) = gw.startup.iter().find(|l| l.contains(needle)) {
        return line.clone();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = gw
            .stderr
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no log line with {needle:?} in 20 s"));
        if line.contains(needle) {
            return strip_ansi(&line);
        }
    }
}

#[tokio::test]
async fn overrides_rename_redescribe_and_hide_and_no_rule_or_path_escapes_them() {
    let dir = tempfile::tempdir().unwrap();
    let calls = dir.path().join("calls.log");
    let files = fixture_server(
        "files",
        &catalog(dir.path()),
        &["--count-file", &calls.display().to_string()],
        OVERRIDES,
    );
    let gw = GatewayProcess::start(&format!(
        "[gateway]\nmode = \"progressive\"\n\n[auth]\nrequired = true\n\n\
         [[policies]]\nserver = \"files\"\ntool = \"purge\"\neffect = \"deny\"\n\n{files}"
    ));
    let config = gw.dir.path().join("manifold.toml");
    let agent = token(&config, "agent", &[]);
    // Scoped to the upstream's name of the renamed tool, as issued before
    // the rename.
    let scoped = token(&config, "scoped", &["--scope", "files__read"]);
    let admin = token(&config, "ops", &["--action", "admin", "--action", "call"]);
    let client = connect(&gw.url, Some(&agent)).await;

    // Found by the new description, under the new name; the hidden tool
    // and the old names are nowhere.
    let found = json(
        &call(
            &client,
            "search_tools",
            json!({"query": "archived contract text customer account"}),
        )
        .await,
    );
    let names = found_names(&found);
    assert_eq!(
        names.first().map(String::as_str),
        Some("files__fetch_document"),
        "{found}"
    );
    let everything = json(
        &call(
            &client,
            "search_tools",
            json!({"query": "file delete read purge trash stat", "limit": 50}),
        )
        .await,
    );
    let names = found_names(&everything);
    for gone in ["files__delete", "files__read", "files__purge"] {
        assert!(!names.iter().any(|n| n == gone), "{gone} in {names:?}");
    }
    let details = text(
        &call(
            &client,
            "get_tool_details",
            json!({"name": "files__fetch_document", "format": "typescript"}),
        )
        .await,
    );
    assert!(details.contains("function fetch_document("), "{details}");
    assert!(details.contains("archived contract text"), "{details}");

    // Called by its new name, by every path; the upstream gets its own name.
    let direct = call(&client, "files__fetch_document", json!({"path": "/a"})).await;
    assert_ne!(direct.is_error, Some(true), "{}", text(&direct));
    let meta = call(
        &client,
        "call_tool",
        json!({"name": "files__fetch_document", "arguments": {"path": "/b"}}),
    )
    .await;
    assert_ne!(meta.is_error, Some(true), "{}", text(&meta));
    let scoped_client = connect(&gw.url, Some(&scoped)).await;
    let by_scope = call(
        &scoped_client,
        "files__fetch_document",
        json!({"path": "/c"}),
    )
    .await;
    assert_ne!(by_scope.is_error, Some(true), "{}", text(&by_scope));
    let script = call(
        &client,
        "execute_code",
        json!({"code": "const r = await files.fetch_document({path: '/d'}); console.log('ok', JSON.stringify(r).length > 0);"}),
    )
    .await;
    assert!(text(&script).contains("ok true"), "{}", text(&script));
    assert_eq!(count_requests(&calls, "tools/call read"), 4);
    assert_eq!(count_requests(&calls, "tools/call fetch_document"), 0);

    // The hidden tool: refused on every path, and never reaches the upstream.
    for name in ["files__delete", "delete"] {
        let refused = call(&client, name, json!({"path": "/x"})).await;
        assert_eq!(refused.is_error, Some(true), "{}", text(&refused));
        assert!(
            text(&refused).contains("Unknown tool"),
            "{}",
            text(&refused)
        );
        let refused = call(
            &client,
            "call_tool",
            json!({"name": name, "arguments": {"path": "/x"}}),
        )
        .await;
        assert_eq!(refused.is_error, Some(true), "{}", text(&refused));
    }
    let script = call(
        &client,
        "execute_code",
        json!({"code": "try { await files.delete({path: '/x'}); console.log('called'); } catch (e) { console.log('refused', String(e)); }"}),
    )
    .await;
    assert!(!text(&script).contains("called"), "{}", text(&script));
    let base = gw.url.trim_end_matches("/mcp").to_string();
    let http = reqwest::Client::new();
    let posted = http
        .post(format!("{base}/call"))
        .bearer_auth(&agent)
        .json(&json!({"name": "files__delete", "arguments": {"path": "/x"}}))
        .send()
        .await
        .unwrap();
    let posted_status = posted.status().as_u16();
    let posted_body = posted.text().await.unwrap();
    assert!(
        posted_status >= 400 || posted_body.contains("Unknown tool"),
        "{posted_status} {posted_body}"
    );
    let export: Value = http
        .get(format!("{base}/export?format=anthropic"))
        .bearer_auth(&agent)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let exported = export.to_string();
    assert!(exported.contains("files__fetch_document"), "{exported}");
    assert!(!exported.contains("files__delete"), "{exported}");
    let playground = http
        .post(format!("{base}/console/playground/call"))
        .bearer_auth(&admin)
        .header("x-manifold-console", "1")
        .json(&json!({"tool": "files__delete", "arg.path": "/x"}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        playground.to_lowercase().contains("no tool files__delete"),
        "{playground}"
    );
    assert_eq!(count_requests(&calls, "tools/call delete"), 0);

    // A deny policy on the upstream's name denies the renamed tool.
    let denied = call(&client, "files__tidy", json!({})).await;
    assert_eq!(denied.is_error, Some(true), "{}", text(&denied));
    assert!(text(&denied).contains("denied"), "{}", text(&denied));
    assert_eq!(count_requests(&calls, "tools/call purge"), 0);

    // The audit names the tool as callers do, and keeps its identity.
    let activity = cli_until(&config, &["audit", "export", "--kind", "activity"], |out| {
        out.contains("files__tidy") && out.matches("files__fetch_document").count() >= 4
    });
    let rows: Vec<Value> = activity
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let fetched = rows
        .iter()
        .find(|r| r["tool"] == "files__fetch_document")
        .unwrap();
    assert_eq!(fetched["details"]["upstream_tool"], "read", "{fetched}");
    assert_eq!(
        fetched["details"]["definition_hash"].as_str().map(str::len),
        Some(64),
        "{fetched}"
    );
    let tidy = rows.iter().find(|r| r["tool"] == "files__tidy").unwrap();
    assert_eq!(tidy["decision"], "denied", "{tidy}");
    assert_eq!(tidy["details"]["upstream_tool"], "purge", "{tidy}");

    // The override naming no tool: logged, and shown to the operator.
    let line = logged(&gw, "tool override not applied");
    assert!(line.contains("'archive' names no tool"), "{line}");
    let server: Value = http
        .get(format!("{base}/admin/servers/files"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        server["overrides_not_applied"],
        json!(["'archive' names no tool of this server"]),
        "{server}"
    );
    let page = http
        .get(format!("{base}/console/servers/files"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("tool overrides not applied"), "{page}");
    assert!(
        page.contains("&#39;archive&#39; names no tool")
            || page.contains("'archive' names no tool"),
        "{page}"
    );
}
