//! Tasks the gateway makes itself (issue 45, done-means 4): a caller that
//! declared the tasks extension, calling a slow tool of an upstream without
//! tasks, gets a task handle once the call has run `task_after_ms`; the
//! result is kept sealed in the store and polled with `tasks/get`, on any
//! replica, by its owner alone. The upstream is `manifold-fixture catalog`
//! with `--delay-ms` or `--hang-call`.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use manifold_store::Backend;
use manifold_test_postgres::TestDatabase;
use serde_json::{Value, json};

use crate::tasks::{post_to, settled_at, token};

/// One `slow` server whose tool `wait` answers after `flags`' delay.
fn slow_server(dir: &std::path::Path, flags: &[&str]) -> String {
    let catalog = write_catalog(
        dir,
        "slow.jsonl",
        &[(
            "slow",
            "wait",
            "Waits, then answers",
            json!({"type": "object", "properties": {"q": {"type": "string"}}}),
        )],
    );
    fixture_server("slow", &catalog, flags, "")
}

/// The secret key the replicas of one PostgreSQL set-up share (task
/// results are sealed with it).
const SHARED_KEY: [(&str, &str); 1] = [(
    "MANIFOLD_SECRET_KEY",
    "a shared test secret of enough length",
)];

/// A config on `db` with auth on, `gateway` lines added to `[gateway]`, and `server`.
fn on_postgres(db: &TestDatabase, gateway: &str, server: String) -> String {
    format!(
        "[gateway]\nmode = \"direct\"\n{gateway}\n[auth]\nrequired = true\n\n\
         [store]\ndatabase_url = {:?}\n\n[search.embedding]\nenabled = false\n\n{server}",
        db.url(),
    )
}

fn secret(created: &Value) -> String {
    created["token"].as_str().unwrap().to_string()
}

struct Gateway {
    gw: GatewayProcess,
    path: std::path::PathBuf,
    alice: String,
    bob: String,
    _catalog: tempfile::TempDir,
}

fn start(flags: &[&str], gateway: &str) -> Gateway {
    let catalog = tempfile::tempdir().unwrap();
    let config = format!(
        "[gateway]\nmode = \"direct\"\ntask_after_ms = 500\n{gateway}\n\n[auth]\nrequired = true\n\n\
         [search.embedding]\nenabled = false\n\n{}",
        slow_server(catalog.path(), flags)
    );
    let gw = GatewayProcess::start(&config);
    let path = gw.dir.path().join("manifold.toml");
    Gateway {
        alice: secret(&token(&path, "alice", &["discover", "call"])),
        bob: secret(&token(&path, "bob", &["discover", "call"])),
        path,
        gw,
        _catalog: catalog,
    }
}

async fn call(url: &str, token: &str, q: &str, declare: bool) -> Value {
    post_to(
        url,
        token,
        "tools/call",
        json!({"name": "slow__wait", "arguments": {"q": q}}),
        declare,
    )
    .await
}

fn task_id(created: &Value) -> String {
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    assert_eq!(created["result"]["status"], "working", "{created}");
    created["result"]["taskId"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_slow_call_becomes_a_task_its_owner_polls_to_the_result() {
    let setup = start(&["--delay-ms", "3000"], "");
    let url = &setup.gw.url;
    let started = Instant::now();
    let created = call(url, &setup.alice, "first", true).await;
    let id = task_id(&created);
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "answered early"
    );

    // The row exists before the handle is out.
    let now = post_to(
        url,
        &setup.alice,
        "tasks/get",
        json!({ "taskId": id }),
        true,
    )
    .await;
    assert_eq!(now["result"]["status"], "working", "{now}");
    let theirs = post_to(url, &setup.bob, "tasks/get", json!({ "taskId": id }), true).await;
    let nobodys = post_to(url, &setup.bob, "tasks/get", json!({ "taskId": "x" }), true).await;
    assert_eq!(theirs["error"]["code"], -32602, "{theirs}");
    assert_eq!(theirs["error"]["code"], nobodys["error"]["code"]);

    let done = settled_at(url, &setup.alice, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    let text = done["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("first"), "{text}");

    // Its creation and its end are in the activity trail.
    let end_of =
        |row: &Value| row["details"]["task"] == id.as_str() && row["details"]["kind"] == "tasks";
    let rows = cli_until(
        &setup.path,
        &["audit", "export", "--kind", "activity"],
        |out| {
            out.lines()
                .filter(|l| end_of(&serde_json::from_str::<Value>(l).unwrap()))
                .count()
                >= 2
        },
    );
    let statuses: Vec<Value> = rows
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(end_of)
        .map(|row| row["details"]["status"].clone())
        .collect();
    assert!(statuses.contains(&json!("created")), "{rows}");
    assert!(statuses.contains(&json!("completed")), "{rows}");

    // Nothing of the result is kept in the clear.
    let data = setup.gw.dir.path().join(".manifold");
    let mut stored = Vec::new();
    for file in ["manifold.db", "manifold.db-wal"] {
        stored.extend(std::fs::read(data.join(file)).unwrap_or_default());
    }
    assert!(!stored.is_empty(), "no database in {}", data.display());
    let plain = String::from_utf8_lossy(&stored);
    assert!(!plain.contains(text), "the result is stored in the clear");
}

#[tokio::test]
async fn a_caller_without_the_extension_gets_the_plain_result() {
    let setup = start(&["--delay-ms", "3000"], "");
    let started = Instant::now();
    let answer = call(&setup.gw.url, &setup.alice, "plain", false).await;
    assert!(started.elapsed() >= Duration::from_millis(2900));
    assert_ne!(answer["result"]["resultType"], "task", "{answer}");
    let text = answer["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("plain"), "{answer}");
}

/// Past `max_tasks_per_principal` working tasks, a call that could become
/// a task is refused before it runs, with a clear error; a caller without
/// the extension and another principal are not held by alice's tasks.
#[tokio::test]
async fn past_the_per_principal_limit_a_call_is_refused_before_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let calls = dir.path().join("calls.log");
    let flags = [
        "--delay-ms",
        "3000",
        "--count-file",
        &calls.display().to_string(),
    ];
    let setup = start(&flags, "max_tasks_per_principal = 1");
    let url = setup.gw.url.clone();
    let id = task_id(&call(&url, &setup.alice, "one", true).await);
    let second = call(&url, &setup.alice, "two", true).await;
    assert_eq!(second["result"]["isError"], true, "{second}");
    let said = second["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        said.contains("too_many_tasks") && said.contains("max_tasks_per_principal"),
        "{second}"
    );
    // Without the extension the call is plain, and runs.
    let plain = call(&url, &setup.alice, "three", false).await;
    assert!(
        plain["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("three"),
        "{plain}"
    );
    // Another principal has its own allowance.
    task_id(&call(&url, &setup.bob, "four", true).await);
    let done = settled_at(&url, &setup.alice, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    // Once alice's task has ended she may make another.
    task_id(&call(&url, &setup.alice, "five", true).await);
    // one, three, four and five reached the upstream; two never did.
    assert_eq!(count_requests(&calls, "tools/call"), 4);
}

#[tokio::test]
async fn a_cancelled_task_stops_its_call() {
    let setup = start(&["--hang-call", "wait"], "");
    let url = &setup.gw.url;
    let id = task_id(&call(url, &setup.alice, "forever", true).await);
    // Answering the request with the handle did not stop the call.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let now = post_to(
        url,
        &setup.alice,
        "tasks/get",
        json!({ "taskId": id }),
        true,
    )
    .await;
    assert_eq!(now["result"]["status"], "working", "{now}");
    let theirs = post_to(
        url,
        &setup.bob,
        "tasks/cancel",
        json!({ "taskId": id }),
        true,
    )
    .await;
    assert_eq!(theirs["error"]["code"], -32602, "{theirs}");
    let ack = post_to(
        url,
        &setup.alice,
        "tasks/cancel",
        json!({ "taskId": id }),
        true,
    )
    .await;
    assert!(ack["error"].is_null(), "{ack}");
    let done = settled_at(url, &setup.alice, &id).await;
    assert_eq!(done["status"], "cancelled", "{done}");
}

#[tokio::test]
async fn a_restart_fails_the_tasks_the_gateway_was_running() {
    let mut setup = start(&["--hang-call", "wait"], "");
    let id = task_id(&call(&setup.gw.url, &setup.alice, "lost", true).await);
    setup.gw.child.kill().unwrap();
    setup.gw.child.wait().unwrap();
    let again = GatewayProcess::start_file(&setup.path, &[]);
    let done = settled_at(&again.url, &setup.alice, &id).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert!(
        done["statusMessage"]
            .as_str()
            .unwrap_or_default()
            .contains("restarted"),
        "{done}"
    );
}

/// Done-means 4: the handle from one replica, polled to the result on the
/// other, and nobody else's there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gateway_task_is_polled_on_the_other_replica() {
    let db = TestDatabase::new(Backend::Postgres).await;
    let catalog = tempfile::tempdir().unwrap();
    let config = on_postgres(
        &db,
        "",
        slow_server(catalog.path(), &["--delay-ms", "3000"]),
    );
    let replicas: Vec<GatewayProcess> = (0..2)
        .map(|_| GatewayProcess::start_with_env(&config, &SHARED_KEY))
        .collect();
    let path = replicas[0].dir.path().join("manifold.toml");
    let alice = secret(&token(&path, "alice", &["discover", "call"]));
    let bob = secret(&token(&path, "bob", &["discover", "call"]));
    let (first, other) = (&replicas[0].url, &replicas[1].url);

    // New tokens reach the other replica through the store's events.
    let deadline = Instant::now() + Duration::from_secs(10);
    for token in [&alice, &bob] {
        loop {
            let listed = post_to(other, token, "tools/list", json!({}), true).await;
            if listed["result"]["tools"].is_array() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "unknown on the other replica: {listed}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let id = task_id(&call(first, &alice, "replicated", true).await);
    let theirs = post_to(other, &bob, "tasks/get", json!({ "taskId": id }), true).await;
    assert_eq!(theirs["error"]["code"], -32602, "{theirs}");
    let done = settled_at(other, &alice, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    let text = done["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("replicated"), "{text}");

    // A cancel on the other replica reaches the one running the call.
    let id = task_id(&call(first, &alice, "stopped", true).await);
    let ack = post_to(other, &alice, "tasks/cancel", json!({ "taskId": id }), true).await;
    assert!(ack["error"].is_null(), "{ack}");
    let done = settled_at(other, &alice, &id).await;
    assert_eq!(done["status"], "cancelled", "{done}");
}

#[tokio::test]
async fn a_result_over_the_size_cap_is_not_kept() {
    let setup = start(&["--delay-ms", "1500"], "max_task_result_bytes = 16");
    let url = &setup.gw.url;
    let id = task_id(&call(url, &setup.alice, "too big to keep", true).await);
    let done = settled_at(url, &setup.alice, &id).await;
    assert_eq!(done["status"], "failed", "{done}");
    let message = done["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("max_task_result_bytes"), "{done}");
    assert!(!done.to_string().contains("too big to keep"), "{done}");
}

/// A call that must wait for an operator's approval is a task at once: the
/// handle comes back before anyone decides, the upstream is not called
/// until the approval, and the task ends with the call's result; a denied
/// one ends with the refusal, and its tool is never called.
#[tokio::test]
async fn a_call_waiting_for_an_approval_is_a_task_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let calls = dir.path().join("calls.log");
    let setup = start(
        &["--count-file", &calls.display().to_string()],
        "\n[governance]\napproval_wait_seconds = 60\n\n\
         [[policies]]\nserver = \"slow\"\neffect = \"require_approval\"\n",
    );
    let url = &setup.gw.url;
    let pending = || -> Vec<Value> {
        serde_json::from_str(&cli(&setup.path, &["approvals", "list", "--json"])).unwrap()
    };
    let decide = |verb: &str, approval: &Value| {
        let id = approval["id"].as_str().unwrap();
        cli(&setup.path, &["approvals", verb, id, "--by", "test"]);
    };

    let started = Instant::now();
    let approved = task_id(&call(url, &setup.alice, "approved", true).await);
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "not a task at once: {:?}",
        started.elapsed()
    );
    let denied = task_id(&call(url, &setup.alice, "denied", true).await);
    let now = post_to(
        url,
        &setup.alice,
        "tasks/get",
        json!({ "taskId": approved }),
        true,
    )
    .await;
    assert_eq!(now["result"]["status"], "working", "{now}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let waiting = loop {
        let waiting = pending();
        if waiting.len() == 2 {
            break waiting;
        }
        assert!(
            Instant::now() < deadline,
            "the approvals were not filed: {waiting:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        count_requests(&calls, "tools/call"),
        0,
        "called before approval"
    );

    // One approved, one denied; which call each belongs to does not matter.
    decide("approve", &waiting[0]);
    decide("deny", &waiting[1]);
    let settled = [
        settled_at(url, &setup.alice, &approved).await,
        settled_at(url, &setup.alice, &denied).await,
    ];
    let failed = |t: &Value| t["result"]["isError"] == true;
    let ran: Vec<&Value> = settled.iter().filter(|t| !failed(t)).collect();
    let refused: Vec<&Value> = settled.iter().filter(|t| failed(t)).collect();
    assert_eq!((ran.len(), refused.len()), (1, 1), "{settled:?}");
    assert_eq!(ran[0]["status"], "completed", "{settled:?}");
    let text = |t: &Value| {
        t["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        text(ran[0]).contains("approved") || text(ran[0]).contains("denied"),
        "the call's own answer: {settled:?}"
    );
    assert!(
        text(refused[0]).contains("denied"),
        "the refusal: {settled:?}"
    );
    assert_eq!(
        count_requests(&calls, "tools/call"),
        1,
        "only the approved call ran"
    );
}

/// A cancel whose event the running replica never heard (its listening
/// connection was down) still stops the call: once the listener is back it
/// re-reads which of its tasks were asked to stop. The cancel here is
/// written to the store with no event at all, so only that re-read can
/// stop the 8 s call before it completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_missed_while_the_listener_was_away_still_stops_the_call() {
    let db = TestDatabase::new(Backend::Postgres).await;
    let catalog = tempfile::tempdir().unwrap();
    let config = on_postgres(
        &db,
        "task_after_ms = 300\n",
        slow_server(catalog.path(), &["--delay-ms", "8000"]),
    );
    let gw = GatewayProcess::start_with_env(&config, &SHARED_KEY);
    let path = gw.dir.path().join("manifold.toml");
    let alice = secret(&token(&path, "alice", &["discover", "call"]));

    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(db.url())
        .await
        .unwrap();
    const LISTENERS: &str =
        "FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%'";
    let deadline = Instant::now() + Duration::from_secs(10);
    while sqlx::query(&format!("SELECT pid {LISTENERS}"))
        .fetch_all(&pool)
        .await
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the gateway never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let id = task_id(&call(&gw.url, &alice, "missed", true).await);
    let started = Instant::now();
    sqlx::query("UPDATE gateway_tasks SET cancel_requested_at = 1 WHERE id = $1")
        .bind(&id)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(&format!("SELECT pg_terminate_backend(pid) {LISTENERS}"))
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;

    let done = settled_at(&gw.url, &alice, &id).await;
    assert_eq!(done["status"], "cancelled", "{done}");
    assert!(
        started.elapsed() < Duration::from_secs(7),
        "cancelled only when the call ended: {:?}",
        started.elapsed()
    );
}
