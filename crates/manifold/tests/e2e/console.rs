//! The admin API on a real gateway with real fixture upstreams: every route
//! the OpenAPI document lists is called, and every answer (success and error)
//! is validated against the schema the served document gives for it.

use crate::common;

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use common::*;
use serde_json::{Value, json};

fn catalog(dir: &std::path::Path) -> std::path::PathBuf {
    let schema = json!({"type": "object", "properties": {"path": {"type": "string"}, "password": {"type": "string"}}});
    let rows = [
        ("files", "read", json!({"readOnlyHint": true})),
        (
            "files",
            "write",
            json!({"readOnlyHint": false, "destructiveHint": false}),
        ),
        (
            "files",
            "delete",
            json!({"readOnlyHint": false, "destructiveHint": true}),
        ),
        ("notes", "list_notes", json!({"readOnlyHint": true})),
        ("notes", "add_note", json!({"readOnlyHint": false})),
    ];
    let text: String = rows
        .iter()
        .map(|(server, name, annotations)| {
            json!({"id": format!("{server}::{name}"), "server": server, "name": name,
                   "description": format!("{name} on {server}."), "input_schema": schema,
                   "annotations": annotations})
            .to_string()
                + "\n"
        })
        .collect();
    let path = dir.join("tools.jsonl");
    std::fs::write(&path, text).unwrap();
    path
}

struct Api {
    http: reqwest::Client,
    base: String,
    token: String,
    doc: Value,
    /// Documented (method, path) pairs called so far.
    seen: BTreeSet<(String, String)>,
}

impl Api {
    /// The schema the document gives for one answer.
    fn schema(&self, method: &str, template: &str, status: u16, content_type: &str) -> Value {
        let op = &self.doc["paths"][template][method];
        assert!(op.is_object(), "{method} {template} is not documented");
        let schema = &op["responses"][status.to_string()]["content"][content_type]["schema"];
        assert!(
            schema.is_object(),
            "{method} {template}: no {content_type} schema for status {status}"
        );
        schema.clone()
    }

    fn validate(&self, schema: &Value, value: &Value, what: &str) {
        // The schema with the document's components beside it, so that
        // `#/components/schemas/...` resolves; every documented object is
        // closed, so an undocumented field fails too.
        let root = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "components": self.doc["components"],
            "allOf": [schema],
        });
        let validator = jsonschema::validator_for(&root).expect("the document's schema compiles");
        let errors: Vec<String> = validator
            .iter_errors(value)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{what} does not match its schema:\n{}\n{value:#}",
            errors.join("\n")
        );
    }

    /// Whether `value` fails `schema`: the validation is not vacuous.
    fn rejects(&self, schema: &Value, value: &Value) -> bool {
        let root = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "components": self.doc["components"],
            "allOf": [schema],
        });
        !jsonschema::validator_for(&root).unwrap().is_valid(value)
    }

    async fn call(
        &mut self,
        method: &str,
        template: &str,
        path: &str,
        body: Option<Value>,
        want: u16,
    ) -> Value {
        let mut request = self
            .http
            .request(method.parse().unwrap(), format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        assert_eq!(status, want, "{method} {path}: {text}");
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}"));
        let method = method.to_lowercase();
        let schema = self.schema(&method, template, status, "application/json");
        self.validate(&schema, &value, &format!("{method} {path} ({status})"));
        self.seen.insert((method, template.to_string()));
        value
    }
}

/// Closes every object schema with properties, so extra fields are errors.
fn close_objects(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.contains_key("properties") && !map.contains_key("additionalProperties") {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            for v in map.values_mut() {
                close_objects(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_api_answers_match_the_openapi_document() {
    let dir = tempfile::tempdir().unwrap();
    let tools = catalog(dir.path());
    let config = format!(
        "[gateway]\nmode = \"direct\"\n\n[auth]\nrequired = true\n\n\
         [search.embedding]\nenabled = false\n\n\
         [admin]\nallow_runtime_servers = true\nallowed_commands = [{:?}]\n\n\
         [governance]\napproval_wait_seconds = 30\n\n\
         [[policies]]\nserver = \"files\"\ntier = \"destructive\"\neffect = \"require_approval\"\n\n{}{}",
        fixture_bin().display().to_string(),
        fixture_server("files", &tools, &[], ""),
        fixture_server("notes", &tools, &[], "autoconnect = false"),
    );
    let gw = GatewayProcess::start(&config);
    let config_path = gw.dir.path().join("manifold.toml");
    let admin: Value = serde_json::from_str(&cli(
        &config_path,
        &[
            "token", "create", "--name", "ops", "--action", "admin", "--json",
        ],
    ))
    .unwrap();
    let agent: Value = serde_json::from_str(&cli(
        &config_path,
        &["token", "create", "--name", "agent", "--json"],
    ))
    .unwrap();
    let base = gw.url.trim_end_matches("/mcp").to_string();
    let http = reqwest::Client::new();

    // The document is public, OpenAPI 3.1, and lists every admin route.
    let response = http
        .get(format!("{base}/admin/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let mut doc: Value = response.json().await.unwrap();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .filter(|k| ["get", "post", "put", "delete"].contains(&k.as_str()))
                .map(move |m| (m.clone(), path.clone()))
        })
        .collect();
    assert!(documented.len() >= 25, "{documented:?}");
    close_objects(&mut doc["components"]);

    let mut api = Api {
        http: http.clone(),
        base: base.clone(),
        token: String::new(),
        doc,
        seen: BTreeSet::new(),
    };

    // No token, then a token without the admin action.
    api.call("GET", "/admin/overview", "/admin/overview", None, 401)
        .await;
    api.token = agent["token"].as_str().unwrap().to_string();
    let response = http
        .get(format!("{base}/admin/overview"))
        .bearer_auth(&api.token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 403);
    api.token = admin["token"].as_str().unwrap().to_string();

    // Servers.
    let overview = api
        .call("GET", "/admin/overview", "/admin/overview", None, 200)
        .await;
    assert_eq!(overview["mode"], "direct");
    assert_eq!(overview["tools"], 3, "{overview:#}");
    let servers = api
        .call("GET", "/admin/servers", "/admin/servers", None, 200)
        .await;
    // The same answer with a field renamed, or one too many, fails.
    let schema = api.schema("get", "/admin/servers", 200, "application/json");
    let mut renamed = servers.clone();
    let first = renamed["servers"][0].as_object_mut().unwrap();
    let count = first.remove("tools").unwrap();
    first.insert("tool_count".into(), count);
    assert!(api.rejects(&schema, &renamed));
    let mut widened = servers.clone();
    widened["servers"][0]["secret"] = json!("x");
    assert!(api.rejects(&schema, &widened));
    let notes = &servers["servers"].as_array().unwrap()[1];
    assert_eq!(
        (notes["name"].as_str(), notes["enabled"].as_bool()),
        (Some("notes"), Some(false))
    );
    api.call(
        "GET",
        "/admin/servers/{name}",
        "/admin/servers/nope",
        None,
        404,
    )
    .await;
    // Only an `auth = "oauth"` server has a sign-in (tests/python/test_upstream_oauth.py
    // signs one in through this route's console twin).
    let refused = api
        .call(
            "POST",
            "/admin/servers/{name}/sign-in",
            "/admin/servers/notes/sign-in",
            None,
            400,
        )
        .await;
    assert!(
        refused.to_string().contains("does not have auth"),
        "{refused}"
    );
    let enabled = api
        .call(
            "POST",
            "/admin/servers/{name}/enable",
            "/admin/servers/notes/enable",
            None,
            200,
        )
        .await;
    assert_eq!(
        (enabled["state"].as_str(), enabled["tools"].as_u64()),
        (Some("connected"), Some(2))
    );
    let disabled = api
        .call(
            "POST",
            "/admin/servers/{name}/disable",
            "/admin/servers/notes/disable",
            None,
            200,
        )
        .await;
    assert_eq!(disabled["tools"], 0);
    let extra = fixture_server("extra", &tools, &[], "");
    let args: Vec<String> = serde_json::from_str(
        extra
            .lines()
            .find_map(|l| l.strip_prefix("args = "))
            .unwrap(),
    )
    .unwrap();
    let mut args = args;
    // Serve the notes catalog under another name.
    let at = args.iter().position(|a| a == "extra").unwrap();
    args[at] = "notes".into();
    let added = api
        .call(
            "POST",
            "/admin/servers",
            "/admin/servers",
            Some(json!({"name": "extra", "description": "Added at run time",
                        "command": fixture_bin().display().to_string(), "args": args})),
            201,
        )
        .await;
    assert_eq!(added["state"], "connected", "{added:#}");
    api.call(
        "POST",
        "/admin/servers",
        "/admin/servers",
        Some(json!({"name": "extra", "url": "http://127.0.0.1:9/mcp"})),
        409,
    )
    .await;
    api.call(
        "POST",
        "/admin/servers",
        "/admin/servers",
        Some(json!({"name": "bad"})),
        400,
    )
    .await;
    let one = api
        .call(
            "GET",
            "/admin/servers/{name}",
            "/admin/servers/extra",
            None,
            200,
        )
        .await;
    assert_eq!(one["tools"], 2, "{one:#}");
    // Added for this process only: not in the file, so not removable from it.
    api.call(
        "DELETE",
        "/admin/servers/{name}",
        "/admin/servers/extra",
        None,
        404,
    )
    .await;
    // Kept in the config file, and removed from it.
    let kept = api
        .call(
            "POST",
            "/admin/servers",
            "/admin/servers",
            Some(
                json!({"name": "kept", "command": fixture_bin().display().to_string(),
                        "args": args, "persist": true, "autoconnect": false}),
            ),
            201,
        )
        .await;
    assert_eq!(kept["name"], "kept", "{kept:#}");
    assert!(
        std::fs::read_to_string(&config_path)
            .unwrap()
            .contains("name = \"kept\"")
    );
    api.call(
        "DELETE",
        "/admin/servers/{name}",
        "/admin/servers/kept",
        None,
        200,
    )
    .await;
    assert!(
        !std::fs::read_to_string(&config_path)
            .unwrap()
            .contains("kept")
    );

    // Catalog.
    let listed = api
        .call(
            "GET",
            "/admin/tools",
            "/admin/tools?server=files",
            None,
            200,
        )
        .await;
    let tiers: Vec<(&str, &str)> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["tool"].as_str().unwrap(), t["tier"].as_str().unwrap()))
        .collect();
    assert_eq!(
        tiers,
        [
            ("delete", "destructive"),
            ("read", "read_only"),
            ("write", "write")
        ]
    );
    let detail = api
        .call(
            "GET",
            "/admin/tools/{server}/{tool}",
            "/admin/tools/files/read",
            None,
            200,
        )
        .await;
    assert!(
        detail["typescript"].as_str().unwrap().contains("read("),
        "{detail:#}"
    );
    assert_eq!(detail["summary"]["hash"].as_str().unwrap().len(), 64);
    api.call(
        "GET",
        "/admin/tools/{server}/{tool}",
        "/admin/tools/files/nope",
        None,
        404,
    )
    .await;
    let quarantined = api
        .call(
            "POST",
            "/admin/tools/{server}/{tool}/quarantine",
            "/admin/tools/files/write/quarantine",
            None,
            200,
        )
        .await;
    assert_eq!(quarantined["status"], "quarantined");
    // An approval names the definition the operator reviewed: none, or one
    // that is no longer current, is refused.
    let reviewed = quarantined["definition_hash"].as_str().unwrap().to_string();
    api.call(
        "POST",
        "/admin/tools/{server}/{tool}/approve",
        "/admin/tools/files/write/approve",
        None,
        400,
    )
    .await;
    let stale = api
        .call(
            "POST",
            "/admin/tools/{server}/{tool}/approve",
            "/admin/tools/files/write/approve",
            Some(json!({"hash": "0".repeat(64)})),
            409,
        )
        .await;
    assert!(
        stale["message"].as_str().unwrap().contains(&reviewed),
        "the answer names the current hash: {stale}"
    );
    let approved = api
        .call(
            "POST",
            "/admin/tools/{server}/{tool}/approve",
            "/admin/tools/files/write/approve",
            Some(json!({"hash": &reviewed[..12]})),
            200,
        )
        .await;
    assert_eq!(approved["status"], "approved");
    let classified = api
        .call(
            "POST",
            "/admin/tools/{server}/{tool}/classify",
            "/admin/tools/files/write/classify",
            Some(json!({"tier": "read_only"})),
            200,
        )
        .await;
    assert_eq!(classified["tier"], "read_only");
    api.call(
        "POST",
        "/admin/tools/{server}/{tool}/classify",
        "/admin/tools/files/write/classify",
        Some(json!({"tier": "harmless"})),
        400,
    )
    .await;

    // Search, two strategies side by side.
    let compared = api
        .call(
            "GET",
            "/admin/search",
            "/admin/search?query=delete&strategies=bm25,regex",
            None,
            200,
        )
        .await;
    let results = compared["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for r in results {
        assert_eq!(r["hits"][0]["name"], "files__delete", "{r:#}");
    }
    api.call(
        "GET",
        "/admin/search",
        "/admin/search?query=x&strategies=psychic",
        None,
        400,
    )
    .await;

    // Tokens.
    let created = api
        .call(
            "POST",
            "/admin/tokens",
            "/admin/tokens",
            Some(json!({"name": "ci", "expires": "1d", "groups": ["bots"]})),
            201,
        )
        .await;
    let secret = created["token"].as_str().unwrap().to_string();
    let id = created["id"].as_str().unwrap().to_string();
    let tokens = api
        .call("GET", "/admin/tokens", "/admin/tokens", None, 200)
        .await;
    assert!(
        !tokens.to_string().contains(&secret),
        "a listing never holds a secret"
    );
    api.call(
        "POST",
        "/admin/tokens",
        "/admin/tokens",
        Some(json!({"name": "x", "actions": ["fly"]})),
        400,
    )
    .await;
    let revoked = api
        .call(
            "POST",
            "/admin/tokens/{id}/revoke",
            &format!("/admin/tokens/{id}/revoke"),
            None,
            200,
        )
        .await;
    assert_eq!(revoked["state"], "revoked");
    api.call(
        "POST",
        "/admin/tokens/{id}/revoke",
        &format!("/admin/tokens/{id}/revoke"),
        None,
        409,
    )
    .await;
    api.call(
        "POST",
        "/admin/tokens/{id}/revoke",
        "/admin/tokens/nope/revoke",
        None,
        404,
    )
    .await;

    // Policies.
    let policy = api
        .call(
            "POST",
            "/admin/policies",
            "/admin/policies",
            Some(json!({"effect": "rate_limit", "server": "files", "limit": 5, "window_seconds": 60})),
            201,
        )
        .await;
    let pid = policy["id"].as_str().unwrap().to_string();
    api.call(
        "PUT",
        "/admin/policies/{id}",
        &format!("/admin/policies/{pid}"),
        Some(json!({"effect": "deny", "tool": "nothing_matches"})),
        200,
    )
    .await;
    let policies = api
        .call("GET", "/admin/policies", "/admin/policies", None, 200)
        .await;
    assert_eq!(policies["policies"].as_array().unwrap().len(), 2);
    api.call(
        "DELETE",
        "/admin/policies/{id}",
        &format!("/admin/policies/{pid}"),
        None,
        200,
    )
    .await;
    api.call(
        "DELETE",
        "/admin/policies/{id}",
        &format!("/admin/policies/{pid}"),
        None,
        404,
    )
    .await;
    api.call(
        "POST",
        "/admin/policies",
        "/admin/policies",
        Some(json!({"effect": "maybe"})),
        400,
    )
    .await;
    api.call(
        "PUT",
        "/admin/policies/{id}",
        "/admin/policies/nope",
        Some(json!({"effect": "deny"})),
        404,
    )
    .await;

    // Approvals: the stream shows a waiting call, approving releases it.
    let events = http
        .get(format!("{base}/admin/approvals/events"))
        .bearer_auth(&api.token)
        .send()
        .await
        .unwrap();
    assert_eq!(events.status().as_u16(), 200);
    assert_eq!(
        events.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    api.schema("get", "/admin/approvals/events", 200, "text/event-stream");
    api.seen
        .insert(("get".into(), "/admin/approvals/events".into()));
    let mut events = events;
    let client = connect(&gw.url, agent["token"].as_str()).await;
    let waiting = tokio::spawn(async move {
        let result = call(
            &client,
            "files__delete",
            json!({"path": "/tmp/x", "password": "hunter2"}),
        )
        .await;
        client.cancel().await.unwrap();
        result
    });
    let mut seen_text = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !seen_text.contains("files__delete") {
        let chunk = tokio::time::timeout_at(deadline.into(), events.chunk())
            .await
            .expect("the stream showed the waiting call")
            .unwrap()
            .expect("the stream stays open");
        seen_text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen_text.contains("event: approvals"), "{seen_text}");
    assert!(!seen_text.contains("hunter2"), "{seen_text}");
    let pending = api
        .call("GET", "/admin/approvals", "/admin/approvals", None, 200)
        .await;
    let approval = &pending["approvals"][0];
    assert_eq!(approval["redacted_args"]["password"], "[redacted]");
    assert_eq!(
        approval["principal"],
        format!("token:{}", agent["id"].as_str().unwrap())
    );
    let aid = approval["id"].as_str().unwrap().to_string();
    api.call(
        "POST",
        "/admin/approvals/{id}/approve",
        &format!("/admin/approvals/{aid}/approve"),
        Some(json!({"by": "test"})),
        200,
    )
    .await;
    let result = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the approved call completes")
        .unwrap();
    assert_ne!(result.is_error, Some(true), "{}", text(&result));
    api.call(
        "POST",
        "/admin/approvals/{id}/deny",
        &format!("/admin/approvals/{aid}/deny"),
        None,
        409,
    )
    .await;
    api.call(
        "POST",
        "/admin/approvals/{id}/approve",
        "/admin/approvals/nope/approve",
        None,
        404,
    )
    .await;
    api.call(
        "POST",
        "/admin/approvals/{id}/deny",
        "/admin/approvals/nope/deny",
        None,
        404,
    )
    .await;

    // Audit: the approved call is there; the export is JSON lines of rows.
    let audit = api
        .call(
            "GET",
            "/admin/audit",
            "/admin/audit?kind=activity&n=5",
            None,
            200,
        )
        .await;
    let last = audit["rows"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (last["tool"].as_str(), last["decision"].as_str()),
        (Some("files__delete"), Some("approved")),
        "{audit:#}"
    );
    api.call("GET", "/admin/audit", "/admin/audit?kind=gossip", None, 400)
        .await;
    let export = http
        .get(format!("{base}/admin/audit/export?since=1h"))
        .bearer_auth(&api.token)
        .send()
        .await
        .unwrap();
    assert_eq!(export.status().as_u16(), 200);
    let row_schema = json!({"$ref": "#/components/schemas/AuditRow"});
    api.schema("get", "/admin/audit/export", 200, "application/x-ndjson");
    api.seen
        .insert(("get".into(), "/admin/audit/export".into()));
    let text = export.text().await.unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 3, "{text}");
    for line in lines {
        api.validate(
            &row_schema,
            &serde_json::from_str(line).unwrap(),
            "an export line",
        );
    }

    let missed: Vec<_> = documented.difference(&api.seen).collect();
    assert!(missed.is_empty(), "routes not exercised: {missed:?}");
}

/// No principal approves its own request: a token that may both call and
/// administer gets 403 on its own pending approval (the console's button
/// posts to the same route with the same principal); another operator's
/// approval releases the call.
#[tokio::test(flavor = "multi_thread")]
async fn a_principal_cannot_approve_its_own_request() {
    let dir = tempfile::tempdir().unwrap();
    let tools = catalog(dir.path());
    let config = format!(
        "[gateway]\nmode = \"direct\"\n\n[auth]\nrequired = true\n\n\
         [search.embedding]\nenabled = false\n\n\
         [governance]\napproval_wait_seconds = 30\n\n\
         [[policies]]\nserver = \"files\"\ntier = \"destructive\"\neffect = \"require_approval\"\n\n{}",
        fixture_server("files", &tools, &[], ""),
    );
    let gw = GatewayProcess::start(&config);
    let config_path = gw.dir.path().join("manifold.toml");
    let token = |name: &str, actions: &[&str]| -> Value {
        let mut args = vec!["token", "create", "--name", name, "--json"];
        for action in actions {
            args.extend(["--action", action]);
        }
        serde_json::from_str(&cli(&config_path, &args)).unwrap()
    };
    let both = token("both", &["discover", "call", "admin"]);
    let ops = token("ops", &["admin"]);
    let base = gw.url.trim_end_matches("/mcp").to_string();
    let http = reqwest::Client::new();

    let client = connect(&gw.url, both["token"].as_str()).await;
    let waiting = tokio::spawn(async move {
        let result = call(&client, "files__delete", json!({"path": "/tmp/x"})).await;
        client.cancel().await.unwrap();
        result
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let id = loop {
        let listed: Value = http
            .get(format!("{base}/admin/approvals"))
            .bearer_auth(both["token"].as_str().unwrap())
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if let Some(first) = listed["approvals"].as_array().and_then(|a| a.first()) {
            break first["id"].as_str().unwrap().to_string();
        }
        assert!(Instant::now() < deadline, "no approval appeared: {listed}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let approve = |token: &Value| {
        http.post(format!("{base}/admin/approvals/{id}/approve"))
            .bearer_auth(token["token"].as_str().unwrap())
            .json(&json!({"by": "me"}))
            .send()
    };
    let own = approve(&both).await.unwrap();
    assert_eq!(own.status().as_u16(), 403);
    let body: Value = own.json().await.unwrap();
    assert_eq!(body["error"], "forbidden", "{body}");
    assert!(!waiting.is_finished(), "the call still waits");

    let other = approve(&ops).await.unwrap();
    assert_eq!(
        other.status().as_u16(),
        200,
        "{}",
        other.text().await.unwrap()
    );
    let result = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_ne!(result.is_error, Some(true), "{}", text(&result));
}

/// Console sign-ins are server-side sessions: the cookie is a random id,
/// not the token; sign-out and the token's revocation end it on the spot;
/// pages forbid framing and sniffing; over https (`public_url`) the cookie
/// is `Secure` and `__Host-` prefixed.
#[tokio::test]
async fn console_sessions_are_server_side_and_end_with_sign_out_or_revocation() {
    let start = |public_url: &str| {
        GatewayProcess::start(&format!(
            "[gateway]\nmode = \"progressive\"\n{public_url}\n\n[auth]\nrequired = true\n\n\
             [search.embedding]\nenabled = false\n"
        ))
    };
    let gw = start("");
    let config = gw.dir.path().join("manifold.toml");
    let created: Value = serde_json::from_str(&cli(
        &config,
        &[
            "token", "create", "--name", "ops", "--action", "admin", "--json",
        ],
    ))
    .unwrap();
    let token = created["token"].as_str().unwrap().to_string();
    let base = gw.url.trim_end_matches("/mcp").to_string();
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let sign_in = || async {
        let response = http
            .post(format!("{base}/console/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={token}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 303);
        let set = response.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(
            set.contains("HttpOnly") && set.contains("SameSite=Strict"),
            "{set}"
        );
        set.split(';').next().unwrap().to_string()
    };
    let page = |cookie: String| {
        let http = http.clone();
        let url = format!("{base}/console");
        async move { http.get(url).header("cookie", cookie).send().await.unwrap() }
    };
    let cookie = sign_in().await;
    assert!(
        !cookie.contains(&token),
        "the cookie holds the token: {cookie}"
    );
    let ok = page(cookie.clone()).await;
    assert_eq!(ok.status().as_u16(), 200);
    let csp = ok.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(ok.headers()["x-content-type-options"], "nosniff");

    // Sign-out ends the session server-side: the old cookie is refused.
    let out = http
        .post(format!("{base}/console/logout"))
        .header("cookie", cookie.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(out.status().as_u16(), 303);
    assert_eq!(
        page(cookie).await.status().as_u16(),
        303,
        "to the sign-in page"
    );

    // Revoking the token ends its sessions.
    let cookie = sign_in().await;
    assert_eq!(page(cookie.clone()).await.status().as_u16(), 200);
    cli(
        &config,
        &["token", "revoke", created["id"].as_str().unwrap()],
    );
    assert_eq!(page(cookie).await.status().as_u16(), 303);

    // Over https the cookie is Secure with the __Host- prefix.
    let tls = start("public_url = \"https://gw.example.com\"");
    let created: Value = serde_json::from_str(&cli(
        &tls.dir.path().join("manifold.toml"),
        &[
            "token", "create", "--name", "ops", "--action", "admin", "--json",
        ],
    ))
    .unwrap();
    let response = http
        .post(format!(
            "{}/console/login",
            tls.url.trim_end_matches("/mcp")
        ))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={}", created["token"].as_str().unwrap()))
        .send()
        .await
        .unwrap();
    let set = response.headers()["set-cookie"].to_str().unwrap();
    assert!(
        set.starts_with("__Host-manifold_console=") && set.contains("; Secure"),
        "{set}"
    );
}
