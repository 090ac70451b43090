//! One guard for everything that comes back (issue 44, item 2): in direct
//! mode, a resource, a prompt, a completion, a tool result and an upstream
//! error that hold an AWS access key, a GitHub token and a token used as an
//! object key reach the client with none of them, and the activity audit
//! holds a row for each answer with its kind and what was masked.

use std::time::{Duration, Instant};

use rmcp::model::{
    ArgumentInfo, CompleteRequestParams, GetPromptRequestParams, ReadResourceRequestParams,
    Reference,
};
use serde_json::{Value, json};

use crate::common::*;

const AWS: &str = "AKIAIOSFODNN7EXAMPLE";
const GITHUB: &str = "ghp_0123456789abcdefghijABCDEFGHIJ012345";
/// Used as an object key, in `_meta` and in structured content.
const KEY_TOKEN: &str = "ghp_ABCDEFGHIJabcdefghij0123456789ABCDEF";

fn leaks(what: &str, shown: &str) {
    for secret in [AWS, GITHUB, KEY_TOKEN] {
        assert!(!shown.contains(secret), "{what} leaked {secret}: {shown}");
    }
}

/// The caller's rows of `kind` naming `named` in the activity audit, waited
/// for: the row is written as the answer goes, and this reads it from
/// another process.
fn rows(config: &std::path::Path, kind: &str, named: &str, outcome: &str) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let found: Vec<Value> = cli(config, &["audit", "export", "--kind", "activity"])
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|r| {
                r["details"]["kind"] == kind && r["tool"] == named && r["outcome"] == outcome
            })
            .collect();
        if !found.is_empty() || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test]
async fn what_comes_back_is_masked_everywhere_and_every_answer_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let leaky = format!("aws {AWS} and github {GITHUB}");
    let meta = json!({ KEY_TOKEN: {"scope": "repo"} });
    let tool = json!({
        "id": "vault::read_config", "server": "vault", "name": "read_config",
        "description": "Read the deploy config.", "annotations": {"readOnlyHint": true},
        "input_schema": {"type": "object"},
        "result": {
            "content": [{"type": "text", "text": leaky}],
            "structuredContent": { KEY_TOKEN: {"aws": AWS, "note": GITHUB} },
            "_meta": meta,
        }
    });
    let catalog = dir.path().join("tools.jsonl");
    std::fs::write(&catalog, format!("{tool}\n")).unwrap();
    let contents = json!({
        "resources": [
            {"resource": {"uri": "file:///deploy/creds", "name": "creds"},
             "result": {"contents": [{"uri": "file:///deploy/creds", "text": leaky,
                                      "_meta": meta}],
                        "_meta": meta}},
            {"resource": {"uri": "file:///deploy/broken", "name": "broken"},
             "error": {"code": -32603, "message": format!("cannot use {GITHUB}"),
                       "data": { KEY_TOKEN: AWS }}},
        ],
        "prompts": [
            {"prompt": {"name": "deploy"},
             "result": {"description": format!("deploys with {AWS}"),
                        "messages": [{"role": "user",
                                      "content": {"type": "text", "text": leaky}}],
                        "_meta": meta}},
        ],
        "completions": [GITHUB, "plain"],
    });
    let contents_path = dir.path().join("contents.json");
    std::fs::write(&contents_path, contents.to_string()).unwrap();
    let contents_flag = contents_path.display().to_string();
    let gw = GatewayProcess::start(&format!(
        "[gateway]\nmode = \"direct\"\n\n{}",
        fixture_server("vault", &catalog, &["--contents", &contents_flag], ""),
    ));
    let config = gw.dir.path().join("manifold.toml");
    let client = connect(&gw.url, None).await;
    let peer = client.peer();

    let read = peer
        .read_resource(ReadResourceRequestParams::new("file:///deploy/creds"))
        .await
        .unwrap();
    let shown = serde_json::to_string(&read).unwrap();
    leaks("resources/read", &shown);
    assert!(shown.contains("[masked:aws_access_key]"), "{shown}");
    assert!(shown.contains("[masked:github_token#1]"), "{shown}");

    let prompt = peer
        .get_prompt(GetPromptRequestParams::new("vault__deploy"))
        .await
        .unwrap();
    let shown = serde_json::to_string(&prompt).unwrap();
    leaks("prompts/get", &shown);
    assert!(shown.contains("[masked:github_token]"), "{shown}");

    let result = call(&client, "vault__read_config", json!({})).await;
    let shown = serde_json::to_string(&result).unwrap();
    leaks("tools/call", &shown);
    let structured = result.structured_content.clone().unwrap();
    assert_eq!(
        structured["[masked:github_token#1]"]["aws"], "[masked:aws_access_key]",
        "{structured}"
    );

    let completed = peer
        .complete(CompleteRequestParams::new(
            Reference::for_prompt("vault__deploy"),
            ArgumentInfo::new("target", "p"),
        ))
        .await
        .unwrap();
    let shown = serde_json::to_string(&completed).unwrap();
    leaks("completion/complete", &shown);
    assert!(shown.contains("plain"), "{shown}");

    let error = peer
        .read_resource(ReadResourceRequestParams::new("file:///deploy/broken"))
        .await
        .unwrap_err();
    let shown = format!("{error} {error:?}");
    leaks("an upstream error", &shown);
    assert!(shown.contains("[masked:github_token]"), "{shown}");

    // A row for each answer, with the kinds and counts masked.
    let masked = |rows: &[Value]| rows[0]["details"]["masked"].clone();
    let read_rows = rows(&config, "resources/read", "vault__*", "success");
    assert_eq!(read_rows.len(), 1, "{read_rows:?}");
    // The text's two, the key in each of the two `_meta`s.
    assert_eq!(
        masked(&read_rows),
        json!({"aws_access_key": 1, "github_token": 3}),
        "{read_rows:?}"
    );
    let prompt_rows = rows(&config, "prompts/get", "vault__deploy", "success");
    assert_eq!(
        masked(&prompt_rows),
        json!({"aws_access_key": 2, "github_token": 2}),
        "{prompt_rows:?}"
    );
    let tool_rows = rows(&config, "tools/call", "vault__read_config", "success");
    assert!(
        masked(&tool_rows)["github_token"].as_u64() >= Some(3),
        "{tool_rows:?}"
    );
    let completion_rows = rows(&config, "completion/complete", "vault__deploy", "success");
    assert_eq!(
        masked(&completion_rows),
        json!({"github_token": 1}),
        "{completion_rows:?}"
    );
    let error_rows = rows(&config, "resources/read", "vault__*", "error");
    assert_eq!(
        masked(&error_rows),
        json!({"aws_access_key": 1, "github_token": 2}),
        "{error_rows:?}"
    );
    // The audit holds no secret either.
    let audit = cli(&config, &["audit", "export", "--kind", "activity"]);
    leaks("the audit", &audit);
}

/// `max_result_bytes` bounds every answer a caller gets, not only tool
/// results: a resource, a prompt and a completion over the server's limit
/// are refused with the reason, and one under it passes.
#[tokio::test]
async fn answers_over_max_result_bytes_are_refused_for_every_kind() {
    let dir = tempfile::tempdir().unwrap();
    let big = "x".repeat(20_000);
    let tool = json!({
        "id": "vault::dump", "server": "vault", "name": "dump",
        "description": "Dump everything.", "annotations": {"readOnlyHint": true},
        "input_schema": {"type": "object"},
        "result": {"content": [{"type": "text", "text": big}]}
    });
    let catalog = dir.path().join("tools.jsonl");
    std::fs::write(&catalog, format!("{tool}\n")).unwrap();
    let contents = json!({
        "resources": [
            {"resource": {"uri": "file:///big", "name": "big"},
             "result": {"contents": [{"uri": "file:///big", "text": big}]}},
            {"resource": {"uri": "file:///small", "name": "small"},
             "result": {"contents": [{"uri": "file:///small", "text": "small"}]}},
        ],
        "prompts": [
            {"prompt": {"name": "big"},
             "result": {"messages": [{"role": "user", "content": {"type": "text", "text": big}}]}},
        ],
        "completions": vec!["y".repeat(400); 50],
    });
    let contents_path = dir.path().join("contents.json");
    std::fs::write(&contents_path, contents.to_string()).unwrap();
    let contents_flag = contents_path.display().to_string();
    let gw = GatewayProcess::start(&format!(
        "[gateway]\nmode = \"direct\"\n\n{}",
        fixture_server(
            "vault",
            &catalog,
            &["--contents", &contents_flag],
            "max_result_bytes = 10000"
        ),
    ));
    let client = connect(&gw.url, None).await;
    let peer = client.peer();
    let refused = |what: &str, error: String| {
        assert!(error.contains("max_result_bytes"), "{what}: {error}");
        assert!(
            !error.contains(&"x".repeat(100)),
            "{what} passed content on"
        );
    };

    let error = peer
        .read_resource(ReadResourceRequestParams::new("file:///big"))
        .await
        .unwrap_err();
    refused("resources/read", error.to_string());
    let error = peer
        .get_prompt(GetPromptRequestParams::new("vault__big"))
        .await
        .unwrap_err();
    refused("prompts/get", error.to_string());
    let error = peer
        .complete(CompleteRequestParams::new(
            Reference::for_prompt("vault__big"),
            ArgumentInfo::new("target", "y"),
        ))
        .await
        .unwrap_err();
    refused("completion/complete", error.to_string());
    let result = call(&client, "vault__dump", json!({})).await;
    let shown = serde_json::to_string(&result).unwrap();
    assert!(
        result.is_error == Some(true) && shown.contains("max_result_bytes"),
        "{shown}"
    );
    assert!(!shown.contains(&"x".repeat(100)), "the tool result passed");

    let small = peer
        .read_resource(ReadResourceRequestParams::new("file:///small"))
        .await
        .unwrap();
    assert!(serde_json::to_string(&small).unwrap().contains("small"));
}
