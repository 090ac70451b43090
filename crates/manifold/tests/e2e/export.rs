//! Provider-native discovery end to end: `manifold export` on the demo
//! catalog against golden files and the provider request shapes in
//! `docs/provider-shapes/`, governance applied to exports and provider
//! searches, the append-only order, and the reference host
//! (`examples/provider_host.py`) completing a task through a real gateway
//! against a stand-in for each provider API.

use crate::common;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Mutex},
};

use common::*;
use serde_json::{Value, json};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn shape_schema(file: &str) -> Value {
    let path = repo_root().join("docs/provider-shapes").join(file);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Validates `instance` against `$defs/{def}` of a provider shape (or the
/// whole document when `def` is `None`).
fn assert_shape(file: &str, def: Option<&str>, instance: &Value) {
    let mut schema = shape_schema(file);
    if let Some(def) = def {
        let root = schema.as_object_mut().unwrap();
        root.remove("required");
        root.remove("properties");
        root.insert("$ref".into(), json!(format!("#/$defs/{def}")));
    }
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .take(5)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{file} {def:?}: {errors:#?}");
}

/// `manifold export` with the store at `database`.
fn export_cli(config: &Path, database: &Path, format: &str, token: Option<&str>) -> String {
    let mut command = Command::new(manifold_bin());
    command
        .args(["export", "--format", format, "--config"])
        .arg(config)
        .env(
            "MANIFOLD_DATABASE_URL",
            manifold_store::sqlite_url(database),
        )
        .env("MANIFOLD_LOG", "warn")
        .env_remove("MANIFOLD_TOKEN");
    if let Some(token) = token {
        command.args(["--token", token]);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "manifold export: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A golden file's text: compact JSON, one array element per line, so that a
/// change shows as the lines of the tools it touches.
fn golden_text(doc: &Value) -> String {
    let mut out = String::from("{\n");
    let fields = doc.as_object().unwrap();
    for (i, (key, value)) in fields.iter().enumerate() {
        out.push_str(&format!("{}:", Value::String(key.clone())));
        match value.as_array() {
            Some(items) => {
                out.push_str("[\n");
                for (j, item) in items.iter().enumerate() {
                    out.push_str(&item.to_string());
                    out.push_str(if j + 1 < items.len() { ",\n" } else { "\n" });
                }
                out.push(']');
            }
            None => out.push_str(&value.to_string()),
        }
        out.push_str(if i + 1 < fields.len() { ",\n" } else { "\n" });
    }
    out.push_str("}\n");
    out
}

fn check_golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("{} missing: run with UPDATE_GOLDEN=1", path.display()));
    assert!(
        expected == actual,
        "{name} differs from the golden file; rerun with UPDATE_GOLDEN=1 and review the diff"
    );
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[test]
fn demo_catalog_exports_match_goldens_and_provider_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let config = repo_root().join("fixtures/demo/manifold.toml");
    let database = dir.path().join("manifold.db");

    let text = export_cli(&config, &database, "anthropic", None);
    let anthropic: Value = serde_json::from_str(&text).unwrap();
    check_golden("export-demo-anthropic.json", &golden_text(&anthropic));
    let tools = anthropic["tools"].as_array().unwrap();
    assert_shape("anthropic-messages.schema.json", None, &anthropic);
    assert_eq!(tools.len(), 690, "689 tools and the search entry");
    assert_eq!(tools[0]["type"], "tool_search_tool_bm25_20251119");
    assert!(tools[1..].iter().all(|t| t["defer_loading"] == true));
    let names: BTreeSet<&str> = tools[1..]
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 689, "provider names are unique");
    assert!(names.iter().all(|n| valid_name(n)));
    for entry in anthropic["names"].as_array().unwrap() {
        assert!(names.contains(entry["name"].as_str().unwrap()));
    }

    let text = export_cli(&config, &database, "openai", None);
    let openai: Value = serde_json::from_str(&text).unwrap();
    check_golden("export-demo-openai.json", &golden_text(&openai));
    assert_shape("openai-responses.schema.json", None, &openai);
    let tools = openai["tools"].as_array().unwrap();
    assert_eq!(tools[0], json!({"type": "tool_search"}));
    // One namespace per server, each holding only that server's tools.
    let mut server_of: BTreeMap<(String, String), String> = BTreeMap::new();
    for entry in openai["names"].as_array().unwrap() {
        let qualified = entry["qualified"].as_str().unwrap();
        let server = qualified.split_once("__").unwrap().0.to_string();
        server_of.insert(
            (
                entry["namespace"].as_str().unwrap().to_string(),
                entry["name"].as_str().unwrap().to_string(),
            ),
            server,
        );
    }
    let namespaces: Vec<&Value> = tools[1..].iter().collect();
    assert_eq!(namespaces.len(), 40);
    let mut seen = BTreeSet::new();
    let mut functions = 0;
    for ns in &namespaces {
        assert_eq!(ns["type"], "namespace");
        assert!(
            ns.get("defer_loading").is_none(),
            "deferral is per function"
        );
        let name = ns["name"].as_str().unwrap();
        assert!(seen.insert(name), "namespace {name} appears once");
        let servers: BTreeSet<&String> = ns["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                assert_eq!(f["defer_loading"], true);
                functions += 1;
                &server_of[&(name.to_string(), f["name"].as_str().unwrap().to_string())]
            })
            .collect();
        assert_eq!(servers.len(), 1, "namespace {name} mixes servers");
    }
    assert_eq!(functions, 689);
    // What was changed to fit each API is reported, per tool.
    for doc in [&anthropic, &openai] {
        for change in doc["schema_changes"].as_array().unwrap() {
            assert!(change["tool"].is_string() && change["path"].is_string());
        }
    }
}

fn files_catalog(dir: &Path) -> PathBuf {
    let schema =
        json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]});
    let rows = [
        ("read", "Read a file.", json!({"readOnlyHint": true})),
        (
            "stat",
            "Show a file's size and dates.",
            json!({"readOnlyHint": true}),
        ),
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

#[tokio::test]
async fn a_read_only_token_exports_and_finds_only_read_only_tools() {
    let dir = tempfile::tempdir().unwrap();
    let files = fixture_server("files", &files_catalog(dir.path()), &[], "");
    let database = dir.path().join("manifold.db");
    let gw = GatewayProcess::start(&format!(
        "[gateway]\nmode = \"progressive\"\n\n[auth]\nrequired = true\n\n\
         [store]\ndatabase_url = {:?}\n\n[code_mode]\nenabled = false\n\n\
         [[policies]]\nprincipal = \"group:readers\"\ntier = \"write\"\neffect = \"deny\"\n\n\
         [[policies]]\nprincipal = \"group:readers\"\ntier = \"destructive\"\neffect = \"deny\"\n\n{files}",
        manifold_store::sqlite_url(&database)
    ));
    let config = gw.dir.path().join("manifold.toml");
    let reader: Value = serde_json::from_str(&cli(
        &config,
        &[
            "token", "create", "--name", "reader", "--group", "readers", "--json",
        ],
    ))
    .unwrap();
    let reader = reader["token"].as_str().unwrap().to_string();
    let base = gw.url.trim_end_matches("/mcp").to_string();
    let http = reqwest::Client::new();

    // The CLI and HTTP exports agree, and hold only the read-only tools.
    let cli_export: Value =
        serde_json::from_str(&export_cli(&config, &database, "anthropic", Some(&reader))).unwrap();
    let names = |doc: &Value| -> Vec<String> {
        doc["names"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["qualified"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&cli_export), ["files__read", "files__stat"]);
    let unauthenticated = http
        .get(format!("{base}/export?format=openai"))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthenticated.status().as_u16(), 401);
    for format in ["anthropic", "openai"] {
        let export: Value = http
            .get(format!("{base}/export?format={format}"))
            .bearer_auth(&reader)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(names(&export), ["files__read", "files__stat"], "{format}");
    }

    // Searching for a write finds nothing writable, in either shape.
    let found: Value = http
        .post(format!("{base}/search"))
        .bearer_auth(&reader)
        .json(&json!({"query": "write delete read file", "format": "anthropic_tool_reference", "call_id": "toolu_1"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_shape(
        "anthropic-messages.schema.json",
        Some("search_tool_result"),
        &found,
    );
    let refs: BTreeSet<&str> = found["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["tool_name"].as_str().unwrap())
        .collect();
    assert!(refs.contains("files__read"), "{found}");
    assert!(
        refs.iter()
            .all(|r| *r == "files__read" || *r == "files__stat"),
        "{found}"
    );
    let client = connect(&gw.url, Some(&reader)).await;
    let output = json(
        &call(
            &client,
            "search_tools",
            json!({"query": "write delete read file", "format": "openai_tool_search_output"}),
        )
        .await,
    );
    assert_shape(
        "openai-responses.schema.json",
        Some("tool_search_output"),
        &output,
    );
    let functions: Vec<&str> = output["tools"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|ns| ns["tools"].as_array().unwrap())
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert!(functions.contains(&"read"), "{output}");
    assert!(
        functions.iter().all(|f| *f == "read" || *f == "stat"),
        "{output}"
    );

    // A provider-facing name calls through the broker, which still refuses
    // what the token may not do.
    let read = call(
        &client,
        "call_tool",
        json!({"name": "files.read", "arguments": {"path": "/a"}}),
    )
    .await;
    assert_ne!(read.is_error, Some(true), "{}", text(&read));
    let refused: Value = http
        .post(format!("{base}/call"))
        .bearer_auth(&reader)
        .json(&json!({"name": "write", "namespace": "files", "arguments": "{\"path\": \"/a\"}"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(refused["tool"], "files__write");
    assert_eq!(
        refused["result"]["structuredContent"]["error"], "denied",
        "{refused}"
    );
    client.cancel().await.unwrap();
}

fn catalog_rows(servers: &[(&str, &[&str])]) -> String {
    let schema = json!({"type": "object", "properties": {"q": {"type": "string"}}});
    let mut text = String::new();
    for (server, tools) in servers {
        for tool in *tools {
            text.push_str(
                &json!({"id": format!("{server}::{tool}"), "server": server, "name": tool,
                        "description": format!("The {tool} tool."), "input_schema": schema})
                .to_string(),
            );
            text.push('\n');
        }
    }
    text
}

fn stability_config(dir: &Path, servers: &[&str]) -> PathBuf {
    let catalog = dir.join("catalog.jsonl");
    let mut text = "[code_mode]\nenabled = false\n\n".to_string();
    for server in servers {
        text.push_str(&fixture_server(server, &catalog, &[], ""));
    }
    let path = dir.join("manifold.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn exported_order(config: &Path, database: &Path, format: &str) -> (String, Vec<String>) {
    let text = export_cli(config, database, format, None);
    let doc: Value = serde_json::from_str(&text).unwrap();
    let order = doc["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["qualified"].as_str().unwrap().to_string())
        .collect();
    (text, order)
}

#[test]
fn export_order_is_stable_and_append_only() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("manifold.db");
    let catalog = dir.path().join("catalog.jsonl");
    std::fs::write(
        &catalog,
        catalog_rows(&[
            ("zeta", &["write", "append", "read"]),
            ("alpha", &["list", "get"]),
            ("mid", &["ping", "pong"]),
        ]),
    )
    .unwrap();
    let config = stability_config(dir.path(), &["zeta", "alpha"]);

    // The same catalog exports byte-identically.
    let (first, order) = exported_order(&config, &database, "anthropic");
    let (again, _) = exported_order(&config, &database, "anthropic");
    assert_eq!(first, again);
    let (openai_first, _) = exported_order(&config, &database, "openai");
    let (openai_again, _) = exported_order(&config, &database, "openai");
    assert_eq!(openai_first, openai_again);

    // A server added (in the middle of the config) goes at the end.
    let config = stability_config(dir.path(), &["zeta", "mid", "alpha"]);
    let (text, grown) = exported_order(&config, &database, "anthropic");
    assert_eq!(grown[..order.len()], order[..], "nothing moved");
    assert_eq!(grown[order.len()..], ["mid__ping", "mid__pong"]);
    // The tools array only grows: the old array is a prefix of the new one.
    let old: Value = serde_json::from_str(&first).unwrap();
    let new: Value = serde_json::from_str(&text).unwrap();
    let old_tools = old["tools"].as_array().unwrap();
    assert_eq!(
        new["tools"].as_array().unwrap()[..old_tools.len()],
        old_tools[..]
    );
    let (_, openai_grown) = exported_order(&config, &database, "openai");
    let openai: Value =
        serde_json::from_str(&exported_order(&config, &database, "openai").0).unwrap();
    let last = openai["tools"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        last["name"], "mid",
        "a new server's namespace goes at the end"
    );
    assert_eq!(openai_grown.len(), grown.len());

    // A removed tool leaves every other tool in the same order.
    std::fs::write(
        &catalog,
        catalog_rows(&[
            ("zeta", &["write", "read"]),
            ("alpha", &["list", "get"]),
            ("mid", &["ping", "pong"]),
        ]),
    )
    .unwrap();
    let (_, shrunk) = exported_order(&config, &database, "anthropic");
    let expected: Vec<String> = grown
        .iter()
        .filter(|n| *n != "zeta__append")
        .cloned()
        .collect();
    assert_eq!(shrunk, expected);
}

// ---------------------------------------------------------------------------
// The reference host against stand-in provider APIs.

#[derive(Clone, Copy, PartialEq)]
enum StandIn {
    Anthropic,
    OpenAi,
}

#[derive(Clone)]
struct StandInState {
    kind: StandIn,
    requests: Arc<Mutex<Vec<Value>>>,
}

/// Scripted model turns in the documented response shapes: search, then
/// call what the search returned, then answer with the tool's result.
async fn stand_in_turn(
    axum::extract::State(state): axum::extract::State<StandInState>,
    axum::Json(request): axum::Json<Value>,
) -> axum::Json<Value> {
    state.requests.lock().unwrap().push(request.clone());
    let response = match state.kind {
        StandIn::Anthropic => {
            assert_shape("anthropic-messages.schema.json", None, &request);
            let messages = request["messages"].as_array().unwrap();
            let last = &messages.last().unwrap()["content"];
            let turn = if messages.len() == 1 {
                json!([{"type": "text", "text": "I'll look for a tool."},
                       {"type": "tool_use", "id": "toolu_search", "name": "manifold_search_tools",
                        "input": {"query": "convert time between timezones", "limit": 3}}])
            } else if last[0]["tool_use_id"] == "toolu_search" {
                assert_shape(
                    "anthropic-messages.schema.json",
                    Some("search_tool_result"),
                    &last[0],
                );
                let name = last[0]["content"][0]["tool_name"].as_str().unwrap();
                json!([{"type": "tool_use", "id": "toolu_call", "name": name,
                        "input": {"time": "12:00", "source_timezone": "UTC", "target_timezone": "Asia/Tokyo"}}])
            } else {
                let result = last[0]["content"].as_str().unwrap();
                json!([{"type": "text", "text": format!("Done: {result}")}])
            };
            let stop = if turn
                .as_array()
                .unwrap()
                .iter()
                .any(|b| b["type"] == "tool_use")
            {
                "tool_use"
            } else {
                "end_turn"
            };
            let response = json!({"id": format!("msg_{}", messages.len()), "type": "message",
                                  "role": "assistant", "model": "stand-in", "content": turn,
                                  "stop_reason": stop});
            assert_shape(
                "anthropic-messages.schema.json",
                Some("response"),
                &response,
            );
            response
        }
        StandIn::OpenAi => {
            assert_shape("openai-responses.schema.json", None, &request);
            let input = request["input"].as_array().unwrap();
            let last = input.last().unwrap();
            let output = if input.len() == 1 {
                json!([{"type": "tool_search_call", "id": "ts_1", "call_id": "call_search",
                        "execution": "client", "status": "completed",
                        "arguments": {"query": "convert time between timezones", "limit": 3}}])
            } else if last["type"] == "tool_search_output" {
                assert_shape(
                    "openai-responses.schema.json",
                    Some("tool_search_output"),
                    last,
                );
                let ns = &last["tools"][0];
                json!([{"type": "function_call", "id": "fc_1", "call_id": "call_fn",
                        "namespace": ns["name"], "name": ns["tools"][0]["name"], "status": "completed",
                        "arguments": "{\"time\": \"12:00\", \"source_timezone\": \"UTC\", \"target_timezone\": \"Asia/Tokyo\"}"}])
            } else {
                assert_eq!(last["type"], "function_call_output");
                let result = last["output"].as_str().unwrap();
                json!([{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": format!("Done: {result}"), "annotations": []}]}])
            };
            let response = json!({"id": format!("resp_{}", input.len()), "object": "response",
                                  "status": "completed", "output": output});
            assert_shape("openai-responses.schema.json", Some("response"), &response);
            response
        }
    };
    axum::Json(response)
}

async fn start_stand_in(kind: StandIn) -> (String, Arc<Mutex<Vec<Value>>>) {
    let requests = Arc::new(Mutex::new(Vec::new()));
    let state = StandInState {
        kind,
        requests: Arc::clone(&requests),
    };
    let app = axum::Router::new()
        .route("/v1/messages", axum::routing::post(stand_in_turn))
        .route("/v1/responses", axum::routing::post(stand_in_turn))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, requests)
}

async fn reference_host_completes_a_task(kind: StandIn) {
    let dir = tempfile::tempdir().unwrap();
    let time_schema = json!({"type": "object", "properties": {
        "time": {"type": "string"}, "source_timezone": {"type": "string"}, "target_timezone": {"type": "string"}},
        "required": ["time", "source_timezone", "target_timezone"]});
    let catalog = write_catalog(
        dir.path(),
        "tools.jsonl",
        &[
            (
                "clock",
                "convert_time",
                "Convert a time between timezones.",
                time_schema.clone(),
            ),
            (
                "clock",
                "get_current_time",
                "The current time in a timezone.",
                json!({"type": "object", "properties": {"timezone": {"type": "string"}}}),
            ),
            (
                "notes",
                "add_note",
                "Add a note.",
                json!({"type": "object", "properties": {"text": {"type": "string"}}}),
            ),
        ],
    );
    let servers =
        fixture_server("clock", &catalog, &[], "") + &fixture_server("notes", &catalog, &[], "");
    let gw = GatewayProcess::start(&format!(
        "[gateway]\nmode = \"progressive\"\n\n[code_mode]\nenabled = false\n\n\
         [export]\nanthropic_search = \"manifold\"\nopenai_search = \"manifold\"\nhot_tools = [\"notes__add_note\"]\n\n{servers}"
    ));
    let (model_url, requests) = start_stand_in(kind).await;
    let provider = match kind {
        StandIn::Anthropic => "anthropic",
        StandIn::OpenAi => "openai",
    };
    let out = tokio::process::Command::new("python3")
        .arg(repo_root().join("examples/provider_host.py"))
        .args([
            "--provider",
            provider,
            "--model-url",
            &model_url,
            "--gateway",
        ])
        .arg(gw.url.trim_end_matches("/mcp"))
        .args(["--task", "What time is noon UTC in Tokyo?"])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "reference host failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let steps = summary["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{summary}");
    assert_eq!(steps[0]["search"], "convert time between timezones");
    assert_eq!(steps[1]["tool"], "clock__convert_time", "{summary}");
    let final_text = summary["final"].as_str().unwrap();
    assert!(final_text.starts_with("Done: "), "{summary}");
    assert!(final_text.contains("convert_time"), "{summary}");
    // The first request sent the deferred catalog with Manifold's search.
    let requests = requests.lock().unwrap();
    assert_eq!(requests.len(), 3);
    let tools = requests[0]["tools"].as_array().unwrap();
    match kind {
        StandIn::Anthropic => {
            assert_eq!(tools[0]["name"], "manifold_search_tools");
            let hot: Vec<&Value> = tools
                .iter()
                .filter(|t| t.get("defer_loading").is_none())
                .collect();
            assert_eq!(hot.len(), 2, "the search tool and the hot tool: {tools:?}");
        }
        StandIn::OpenAi => {
            assert_eq!(tools[0]["execution"], "client");
            assert_eq!(tools.len(), 3, "search, clock, notes");
        }
    }
    // Every request carries the same tools array: the prompt cache holds.
    assert!(requests.iter().all(|r| r["tools"] == requests[0]["tools"]));
}

#[tokio::test]
async fn reference_host_completes_a_task_against_anthropic_stand_in() {
    reference_host_completes_a_task(StandIn::Anthropic).await;
}

#[tokio::test]
async fn reference_host_completes_a_task_against_openai_stand_in() {
    reference_host_completes_a_task(StandIn::OpenAi).await;
}
