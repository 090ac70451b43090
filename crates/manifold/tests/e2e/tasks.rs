//! Tasks through the gateway (the `io.modelcontextprotocol/tasks`
//! extension, issue 45): an upstream's task reaches the caller under a
//! gateway id, `tasks/*` are decided at the broker's door with refusal rows,
//! and a task is its creator's alone. The upstream is `manifold-fixture
//! conformance`, whose task tools run under rmcp's task manager.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use manifold_store::Backend;
use manifold_test_postgres::TestDatabase;
use serde_json::{Value, json};

const TASKS: &str = "io.modelcontextprotocol/tasks";

struct Setup {
    gw: GatewayProcess,
    alice: String,
    bob: String,
    /// `discover` only.
    viewer: String,
    viewer_id: String,
}

pub(crate) fn token(config: &std::path::Path, name: &str, actions: &[&str]) -> Value {
    let mut args = vec!["token", "create", "--name", name, "--json"];
    for action in actions {
        args.extend(["--action", action]);
    }
    serde_json::from_str(&cli(config, &args)).unwrap()
}

fn start() -> Setup {
    let config = format!(
        "[gateway]\nmode = \"direct\"\n\n[auth]\nrequired = true\n\n\
         [[servers]]\nname = \"conf\"\ndescription = \"The conformance fixture\"\n\
         command = {:?}\nargs = [\"conformance\"]\n",
        fixture_bin().display().to_string(),
    );
    let gw = GatewayProcess::start(&config);
    let path = gw.dir.path().join("manifold.toml");
    let alice = token(&path, "alice", &["discover", "call"]);
    let bob = token(&path, "bob", &["discover", "call"]);
    let viewer = token(&path, "viewer", &["discover"]);
    Setup {
        alice: alice["token"].as_str().unwrap().to_string(),
        bob: bob["token"].as_str().unwrap().to_string(),
        viewer: viewer["token"].as_str().unwrap().to_string(),
        viewer_id: viewer["id"].as_str().unwrap().to_string(),
        gw,
    }
}

/// One stateless 2026-07-28 request as `token`, declaring the tasks
/// extension when `declare`; its JSON-RPC answer.
async fn post(setup: &Setup, token: &str, method: &str, params: Value, declare: bool) -> Value {
    post_to(&setup.gw.url, token, method, params, declare).await
}

/// [`post`] to the gateway at `url`.
pub(crate) async fn post_to(
    url: &str,
    token: &str,
    method: &str,
    params: Value,
    declare: bool,
) -> Value {
    let mut params = params;
    let capabilities = if declare {
        json!({ "extensions": { TASKS: {} } })
    } else {
        json!({})
    };
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": "tasks-e2e", "version": "1"},
    });
    let name = ["name", "taskId"]
        .iter()
        .find_map(|key| params[key].as_str())
        .unwrap_or_default()
        .to_string();
    let mut request = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if !name.is_empty() {
        request = request.header("mcp-name", name);
    }
    let body = request
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let text = body
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .rfind(|l| l.contains("\"id\""))
        .map(str::to_string)
        .unwrap_or(body);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{method}: {e}: {text}"))
}

/// `tasks/get` as `token` until the task is terminal (or the deadline).
async fn settled(setup: &Setup, token: &str, id: &str) -> Value {
    settled_at(&setup.gw.url, token, id).await
}

/// [`settled`] at the gateway at `url`.
pub(crate) async fn settled_at(url: &str, token: &str, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = post_to(url, token, "tasks/get", json!({ "taskId": id }), true).await;
        let status = got["result"]["status"].as_str().unwrap_or_default();
        if ["completed", "failed", "cancelled"].contains(&status) {
            return got["result"].clone();
        }
        assert!(Instant::now() < deadline, "task {id} never settled: {got}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn slow_task(setup: &Setup, seconds: u64) -> String {
    let created = post(
        setup,
        &setup.alice,
        "tools/call",
        json!({"name": "conf__slow_compute", "arguments": {"seconds": seconds, "label": "e2e"}}),
        true,
    )
    .await;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    created["result"]["taskId"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn an_upstream_task_is_its_callers_alone_and_every_task_request_is_decided() {
    let setup = start();

    // The gateway's id, not the upstream's (a UUID), reaches the caller,
    // and it resolves at once.
    let id = slow_task(&setup, 1).await;
    assert_eq!(
        id.len(),
        22,
        "a gateway id is 128 random bits, not the upstream's: {id}"
    );
    let working = post(
        &setup,
        &setup.alice,
        "tasks/get",
        json!({ "taskId": id }),
        true,
    )
    .await;
    assert_eq!(working["result"]["taskId"], id.as_str(), "{working}");

    // Another principal gets the unknown-id answer, for every method.
    for (method, params) in [
        ("tasks/get", json!({ "taskId": id })),
        (
            "tasks/update",
            json!({ "taskId": id, "inputResponses": {} }),
        ),
        ("tasks/cancel", json!({ "taskId": id })),
    ] {
        let other = post(&setup, &setup.bob, method, params, true).await;
        assert_eq!(other["error"]["code"], -32602, "{method}: {other}");
    }
    // ... word for word as for an id nobody has.
    let theirs = post(
        &setup,
        &setup.bob,
        "tasks/get",
        json!({ "taskId": id }),
        true,
    )
    .await;
    let nobodys = post(
        &setup,
        &setup.bob,
        "tasks/get",
        json!({ "taskId": "x" }),
        true,
    )
    .await;
    let said = |answer: &Value, id: &str| answer["error"].to_string().replace(id, "ID");
    assert_eq!(said(&theirs, &id), said(&nobodys, "x"));

    // A token without `call` is refused at the door, and each refusal is
    // in the activity audit with its request kind.
    for (method, params) in [
        ("tasks/get", json!({ "taskId": id })),
        (
            "tasks/update",
            json!({ "taskId": id, "inputResponses": {} }),
        ),
        ("tasks/cancel", json!({ "taskId": id })),
    ] {
        let refused = post(&setup, &setup.viewer, method, params, true).await;
        assert_eq!(
            refused["error"]["data"]["error"], "action_not_allowed",
            "{method}: {refused}"
        );
        let config = setup.gw.dir.path().join("manifold.toml");
        let viewer = format!("token:{}", setup.viewer_id);
        let refusal_of =
            |row: &Value| row["details"]["kind"] == method && row["principal"] == viewer.as_str();
        let rows = cli_until(&config, &["audit", "export", "--kind", "activity"], |out| {
            out.lines()
                .any(|l| refusal_of(&serde_json::from_str::<Value>(l).unwrap()))
        });
        let row = rows
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .find(refusal_of)
            .unwrap_or_else(|| panic!("no {method} refusal row: {rows}"));
        assert_eq!(row["details"]["refusal"], "action_not_allowed", "{row}");
    }

    // Without the extension declared, tasks/* are -32021.
    let undeclared = post(
        &setup,
        &setup.alice,
        "tasks/get",
        json!({ "taskId": id }),
        false,
    )
    .await;
    assert_eq!(undeclared["error"]["code"], -32021, "{undeclared}");

    // The owner polls to the inlined result.
    let done = settled(&setup, &setup.alice, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    let text = done["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("e2e: done"), "{text}");

    // Its creation and its end are in the activity trail, the end once
    // however often it is polled after.
    post(
        &setup,
        &setup.alice,
        "tasks/get",
        json!({ "taskId": id }),
        true,
    )
    .await;
    let config = setup.gw.dir.path().join("manifold.toml");
    let of_task =
        |row: &Value| row["details"]["kind"] == "tasks" && row["details"]["task"] == id.as_str();
    let rows = cli_until(&config, &["audit", "export", "--kind", "activity"], |out| {
        out.lines()
            .filter(|l| of_task(&serde_json::from_str::<Value>(l).unwrap()))
            .count()
            >= 2
    });
    let statuses: Vec<Value> = rows
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(of_task)
        .map(|row| {
            assert_eq!(row["tool"], "conf__slow_compute", "{row}");
            row["details"]["status"].clone()
        })
        .collect();
    assert_eq!(statuses, [json!("created"), json!("completed")], "{rows}");

    // tasks/cancel reaches the upstream, which settles the task cancelled.
    let long = slow_task(&setup, 60).await;
    let ack = post(
        &setup,
        &setup.alice,
        "tasks/cancel",
        json!({ "taskId": long }),
        true,
    )
    .await;
    assert_eq!(ack["result"]["resultType"], "complete", "{ack}");
    assert_eq!(
        settled(&setup, &setup.alice, &long).await["status"],
        "cancelled"
    );
}

/// Code mode never sees a task handle: a script calling a tool that runs
/// only as a task gets the task's result, which the gateway polled for it.
#[tokio::test]
async fn a_script_awaits_a_tool_that_runs_only_as_a_task() {
    let config = format!(
        "[gateway]\nmode = \"progressive\"\n\n\
         [code_mode]\nsandbox = \"in_process\"\nworkers = 1\n\n\
         [[servers]]\nname = \"conf\"\ndescription = \"The conformance fixture\"\n\
         command = {:?}\nargs = [\"conformance\"]\n",
        fixture_bin().display().to_string(),
    );
    let gw = GatewayProcess::start(&config);
    let client = connect(&gw.url, None).await;
    // failing_job answers -32021 to a call without the extension, and as a
    // task reports a tool error after a second.
    let result = call(
        &client,
        "execute_code",
        json!({ "code": r#"
try {
  await conf.failing_job({});
} catch (e) {
  if (!(e instanceof ToolError)) throw e;
  console.log((e.content as { text: string }[])[0].text);
  return "handled";
}
"# }),
    )
    .await;
    let out = text(&result);
    assert_ne!(result.is_error, Some(true), "{out}");
    assert_eq!(
        out,
        "failing_job failed, as it always does\nReturned: \"handled\"\n"
    );
    client.cancel().await.unwrap();
}

/// Two replicas on one PostgreSQL store, serving `conf` as `server` (the
/// lines of its `[[servers]]` entry after its name), and alice's and bob's
/// tokens, known to both.
async fn two_replicas(server: &str) -> (TestDatabase, Vec<GatewayProcess>, String, String) {
    let db = TestDatabase::new(Backend::Postgres).await;
    let config = format!(
        "[gateway]\nmode = \"direct\"\n\n[auth]\nrequired = true\n\n\
         [store]\ndatabase_url = {:?}\n\n[search.embedding]\nenabled = false\n\n\
         [[servers]]\nname = \"conf\"\ndescription = \"The conformance fixture\"\n{server}",
        db.url(),
    );
    let replicas: Vec<GatewayProcess> = (0..2).map(|_| GatewayProcess::start(&config)).collect();
    let path = replicas[0].dir.path().join("manifold.toml");
    let alice = token(&path, "alice", &["discover", "call"])["token"]
        .as_str()
        .unwrap()
        .to_string();
    let bob = token(&path, "bob", &["discover", "call"])["token"]
        .as_str()
        .unwrap()
        .to_string();

    // A new token reaches the other replica through the store's events;
    // wait until it is known there.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let listed = post_to(&replicas[1].url, &alice, "tools/list", json!({}), true).await;
        if listed["result"]["tools"].is_array() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "alice unknown on the other replica: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (db, replicas, alice, bob)
}

/// alice's `slow_compute` task, made through `url`: its gateway id.
async fn slow_task_at(url: &str, alice: &str) -> String {
    let created = post_to(
        url,
        alice,
        "tools/call",
        json!({"name": "conf__slow_compute", "arguments": {"seconds": 1, "label": "replica"}}),
        true,
    )
    .await;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    created["result"]["taskId"].as_str().unwrap().to_string()
}

/// The task mapping is in the store: a task an HTTP upstream made through
/// one replica is polled to its result on the other, and is still nobody
/// else's there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_http_upstreams_task_is_polled_on_the_other_replica() {
    let upstream = HttpFixture::conformance();
    let (_db, replicas, alice, bob) = two_replicas(&format!("url = {:?}\n", upstream.url)).await;
    let (first, other) = (&replicas[0].url, &replicas[1].url);
    let id = slow_task_at(first, &alice).await;

    let theirs = post_to(other, &bob, "tasks/get", json!({ "taskId": id }), true).await;
    assert_eq!(theirs["error"]["code"], -32602, "{theirs}");
    let done = settled_at(other, &alice, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    let text = done["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("replica: done"), "{text}");
}

/// A stdio server's task lives in the child process of the replica that
/// made it. The other replica says so, after the door's decision, instead
/// of asking its own child, which never heard of the task; the replica
/// that made it polls it to its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stdio_upstreams_task_asked_of_another_replica_says_where_it_lives() {
    let server = format!(
        "command = {:?}\nargs = [\"conformance\"]\n",
        fixture_bin().display().to_string()
    );
    let (_db, replicas, alice, bob) = two_replicas(&server).await;
    let (first, other) = (&replicas[0].url, &replicas[1].url);
    let id = slow_task_at(first, &alice).await;

    let theirs = post_to(other, &bob, "tasks/get", json!({ "taskId": id }), true).await;
    assert_eq!(
        theirs["error"]["code"], -32602,
        "still nobody else's: {theirs}"
    );
    for method in ["tasks/get", "tasks/cancel"] {
        let elsewhere = post_to(other, &alice, method, json!({ "taskId": id }), true).await;
        assert_eq!(elsewhere["error"]["code"], -32603, "{method}: {elsewhere}");
        let message = elsewhere["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("replica that made it") && message.contains("Mcp-Name"),
            "{method}: {message}"
        );
    }
    let done = settled_at(first, &alice, &id).await;
    assert_eq!(
        done["status"], "completed",
        "the cancel never reached it: {done}"
    );
}
