//! Code mode end to end: `execute_code` on a real gateway, scripts run by
//! isolated worker processes, every stub call through the broker, checked
//! on the upstream's side (its request log).

use crate::common;

use std::{path::Path, sync::Arc, time::Duration};

use common::*;
use futures::{FutureExt, future::BoxFuture};
use manifold_codemode::{
    engine::{Ending, EngineLimits},
    pool::{RunEnd, RunLimits, Sandbox, SandboxConfig, SandboxMode, ToolCalls},
};
use serde_json::{Value, json};

/// `web` (untrusted, read-only fetch) and `tickets` (create: no
/// annotations, so destructive; list: read-only).
fn catalog(dir: &Path) -> std::path::PathBuf {
    let rows = [
        (
            "web",
            "fetch_page",
            "Fetch a web page.",
            json!({"readOnlyHint": true}),
        ),
        ("tickets", "create_ticket", "Open a ticket.", Value::Null),
        (
            "tickets",
            "list_tickets",
            "List open tickets.",
            json!({"readOnlyHint": true}),
        ),
        (
            "tickets",
            "close_ticket",
            "Close a ticket.",
            json!({"readOnlyHint": false, "destructiveHint": false}),
        ),
    ];
    let text: String = rows
        .iter()
        .map(|(server, name, description, annotations)| {
            let mut row = json!({"id": format!("{server}::{name}"), "server": server, "name": name,
                "description": description,
                "input_schema": {"type": "object", "properties": {"title": {"type": "string"}, "url": {"type": "string"}}}});
            if !annotations.is_null() {
                row["annotations"] = annotations.clone();
            }
            if *name == "close_ticket" {
                row["result"] = json!({"content": [{"type": "text", "text": "ticket 7 is locked"}], "isError": true});
            }
            row.to_string() + "\n"
        })
        .collect();
    let path = dir.join("tools.jsonl");
    std::fs::write(&path, text).unwrap();
    path
}

struct Setup {
    gateway: GatewayProcess,
    _dir: tempfile::TempDir,
    tickets_log: std::path::PathBuf,
}

fn start(extra: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let catalog = catalog(dir.path());
    let tickets_log = dir.path().join("tickets.log");
    let log_flag = tickets_log.display().to_string();
    let config = format!(
        "[gateway]\nmode = \"progressive\"\n\n[governance]\napproval_wait_seconds = 0\n\n{extra}\n{}\n{}",
        fixture_server("web", &catalog, &[], "untrusted = true"),
        fixture_server("tickets", &catalog, &["--count-file", &log_flag], ""),
    );
    Setup {
        gateway: GatewayProcess::start(&config),
        _dir: dir,
        tickets_log,
    }
}

async fn execute(client: &Client, code: &str) -> (String, bool) {
    let result = call(client, "execute_code", json!({ "code": code })).await;
    (text(&result), result.is_error == Some(true))
}

#[tokio::test]
async fn execute_code_runs_typescript_against_stubs_through_the_broker() {
    let setup = start("");
    let client = connect(&setup.gateway.url, None).await;
    let tools = client.peer().list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names.last(), Some(&"execute_code"), "{names:?}");

    let stubs = text(
        &call(
            &client,
            "get_tool_details",
            json!({"name": "tickets__list_tickets", "format": "typescript"}),
        )
        .await,
    );
    assert!(stubs.contains("declare namespace tickets"), "{stubs}");
    assert!(stubs.contains("function list_tickets("), "{stubs}");

    let (out, failed) = execute(
        &client,
        r#"
interface Ticket { title: string }
const titles: string[] = ["disk full", "disk full", "timeout"];
const unique = [...new Set(titles)];
const results = await Promise.all(unique.map((title) => tickets.create_ticket({ title })));
console.log(`opened ${results.length}`);
const listed = await callTool("tickets__list_tickets", {});
return { opened: results.length, listedFrom: (listed as any).source.server };
"#,
    )
    .await;
    assert!(!failed, "{out}");
    assert!(out.contains("opened 2"), "{out}");
    assert!(
        out.contains(r#"Returned: {"opened":2,"listedFrom":"tickets"}"#),
        "{out}"
    );
    assert_eq!(
        count_requests(&setup.tickets_log, "tools/call create_ticket"),
        2
    );
    assert_eq!(
        count_requests(&setup.tickets_log, "tools/call list_tickets"),
        1
    );
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn errors_come_back_with_a_caret_a_stack_or_the_logs_so_far() {
    let setup = start("");
    let client = connect(&setup.gateway.url, None).await;

    let (out, failed) = execute(&client, "const x: number = ;\nconsole.log(x);").await;
    assert!(failed);
    assert!(out.contains("line 1"), "{out}");
    assert!(out.contains('^'), "{out}");
    assert!(out.contains("Nothing ran"), "{out}");
    assert_eq!(count_requests(&setup.tickets_log, "tools/call"), 0);

    let (out, failed) = execute(
        &client,
        "console.log('step 1');\nfunction fail(): never { throw new TypeError('bad input'); }\nfail();",
    )
    .await;
    assert!(failed);
    assert!(out.starts_with("step 1\n"), "{out}");
    assert!(out.contains("Uncaught TypeError: bad input"), "{out}");
    assert!(out.contains("fail"), "the stack names the function: {out}");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn an_upstream_is_error_throws_a_catchable_tool_error() {
    let setup = start("");
    let client = connect(&setup.gateway.url, None).await;
    let (out, failed) = execute(
        &client,
        r#"
try {
  await tickets.close_ticket({ title: "7" });
} catch (e) {
  if (!(e instanceof ToolError)) throw e;
  console.log(e.server, e.tool, (e.content as { text: string }[])[0].text);
  return "handled";
}
"#,
    )
    .await;
    assert!(!failed, "{out}");
    assert_eq!(
        out,
        "tickets close_ticket ticket 7 is locked\nReturned: \"handled\"\n"
    );
    assert_eq!(
        count_requests(&setup.tickets_log, "tools/call close_ticket"),
        1
    );
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_denied_call_is_a_tool_error_the_upstream_never_sees() {
    let setup = start(
        "[[policies]]\nprincipal = \"*\"\nserver = \"tickets\"\ntool = \"create_ticket\"\neffect = \"deny\"\n",
    );
    let client = connect(&setup.gateway.url, None).await;
    let (out, failed) = execute(
        &client,
        r#"
try {
  await tickets.create_ticket({ title: "x" });
} catch (e) {
  if (e instanceof ToolError) console.log(`${e.name} ${(e as any).code} ${e.server}/${e.tool}`);
}
await tickets.list_tickets({});
"#,
    )
    .await;
    assert!(!failed, "{out}");
    assert!(
        out.contains("ToolError denied tickets/create_ticket"),
        "{out}"
    );
    assert_eq!(
        count_requests(&setup.tickets_log, "tools/call create_ticket"),
        0
    );
    assert_eq!(
        count_requests(&setup.tickets_log, "tools/call list_tickets"),
        1
    );
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn reading_an_untrusted_server_then_writing_elsewhere_needs_approval() {
    let setup = start("");
    let client = connect(&setup.gateway.url, None).await;
    approve_quarantined(
        &client,
        &setup.gateway.dir.path().join("manifold.toml"),
        "web",
    )
    .await;

    // The same write without the untrusted read goes through.
    let (out, failed) = execute(&client, "await tickets.create_ticket({ title: 'clean' });").await;
    assert!(!failed, "{out}");
    assert_eq!(
        count_requests(&setup.tickets_log, "tools/call create_ticket"),
        1
    );

    let (out, failed) = execute(
        &client,
        r#"
const page = await web.fetch_page({ url: "https://example.test" });
await tickets.list_tickets({});
try {
  await tickets.create_ticket({ title: "from the page" });
} catch (e) {
  console.log((e as any).code, "|", (e as Error).message);
  throw e;
}
"#,
    )
    .await;
    assert!(failed, "{out}");
    assert!(out.contains("approval_required"), "{out}");
    assert!(
        out.contains("untrusted server web"),
        "the error says why: {out}"
    );
    assert_eq!(
        count_requests(&setup.tickets_log, "tools/call create_ticket"),
        1,
        "the tainted write never reached the upstream"
    );
    assert_eq!(
        count_requests(&setup.tickets_log, "tools/call list_tickets"),
        1,
        "reads stay allowed"
    );
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn the_call_cap_holds_and_output_is_truncated_with_a_marker() {
    let setup = start("[code_mode]\nmax_calls = 3\nmax_output_bytes = 300\n");
    let client = connect(&setup.gateway.url, None).await;
    let (out, failed) = execute(
        &client,
        r#"
let refused = 0;
for (let i = 0; i < 5; i++) {
  try { await tickets.list_tickets({}); } catch (e) { if ((e as any).code === "call_limit") refused++; }
}
console.log(`refused ${refused}`);
for (let i = 0; i < 100; i++) console.log(`line ${i} ${"x".repeat(20)}`);
"#,
    )
    .await;
    assert!(!failed, "{out}");
    assert!(out.starts_with("refused 2\n"), "{out}");
    assert!(out.contains("[output truncated:"), "{out}");
    assert!(out.contains("2 tool calls were refused"), "{out}");
    assert!(!out.contains("line 99"), "{out}");
    assert_eq!(
        count_requests(&setup.tickets_log, "tools/call list_tickets"),
        3
    );
    client.cancel().await.unwrap();
}

/// Answers every call with an empty result.
struct Echo;

impl ToolCalls for Echo {
    fn call(&self, tool: String, _args: Value) -> BoxFuture<'static, (bool, Value)> {
        async move {
            (
                true,
                json!({ "result": { "content": [] }, "server": "echo", "tool": tool }),
            )
        }
        .boxed()
    }
}

fn sandbox_config(limits: RunLimits) -> SandboxConfig {
    SandboxConfig {
        mode: SandboxMode::Process,
        workers: 1,
        program: manifold_bin(),
        args: vec!["sandbox-worker".into()],
        limits,
        admission: Default::default(),
    }
}

#[tokio::test]
async fn workers_are_isolated_and_a_killed_worker_is_replaced_with_the_reason() {
    let limits = RunLimits {
        engine: EngineLimits {
            wall_ms: 20_000,
            ..EngineLimits::default()
        },
        ..RunLimits::default()
    };
    let sandbox = Sandbox::start(sandbox_config(limits)).await.unwrap();
    let report = sandbox.isolation();
    for layer in report["layers"].as_array().unwrap() {
        assert_eq!(layer["active"], true, "{layer}");
    }
    for probe in report["probes"].as_array().unwrap() {
        assert_eq!(
            probe["blocked"], true,
            "files, environment, network and processes are out of reach: {probe}"
        );
    }

    let pid = sandbox.worker_pids()[0];
    let run = {
        let sandbox = Arc::clone(&sandbox);
        tokio::spawn(async move {
            sandbox
                .run(
                    "test",
                    "console.log('started'); await new Promise(() => {});".into(),
                    vec![],
                    limits,
                    Arc::new(Echo),
                )
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // SAFETY: plain kill(2) on the worker's pid.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let output = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .unwrap()
        .unwrap();
    match &output.end {
        RunEnd::WorkerLost { reason } => assert!(reason.contains("signal 9"), "{reason}"),
        other => panic!("expected a lost worker, got {other:?}"),
    }
    assert_eq!(output.logs.len(), 1, "the logs so far: {:?}", output.logs);
    assert_eq!(sandbox.replaced(), 1);

    let output = sandbox
        .run(
            "test",
            "return 1 + 1;".into(),
            vec![],
            limits,
            Arc::new(Echo),
        )
        .await
        .unwrap();
    match output.end {
        RunEnd::Engine(report) => {
            assert_eq!(report.ending, Ending::Completed);
            assert_eq!(report.value, Some(json!(2)));
        }
        other => panic!("the replacement runs scripts: {other:?}"),
    }
    assert_ne!(sandbox.worker_pids(), vec![pid]);
}

#[tokio::test]
async fn limits_hold_in_an_isolated_worker() {
    // Each case gets generous room on the other limits, so a loaded machine
    // (less CPU per wall second) cannot make one limit trip for another.
    let limits = |cpu_ms, wall_ms| RunLimits {
        engine: EngineLimits {
            cpu_ms,
            wall_ms,
            memory_bytes: 32 << 20,
            ..EngineLimits::default()
        },
        ..RunLimits::default()
    };
    let sandbox = Sandbox::start(sandbox_config(limits(300, 1_000)))
        .await
        .unwrap();
    for (script, limits, want) in [
        (
            "try { while (true) {} } catch (e) { console.log('caught'); }",
            limits(300, 60_000),
            Ending::CpuDeadline,
        ),
        (
            "await new Promise(() => {});",
            limits(60_000, 1_000),
            Ending::WallDeadline,
        ),
        (
            "const a = []; while (true) a.push(new Array(1e5).fill(1));",
            limits(60_000, 60_000),
            Ending::MemoryLimit,
        ),
    ] {
        let output = sandbox
            .run("test", script.into(), vec![], limits, Arc::new(Echo))
            .await
            .unwrap();
        match output.end {
            RunEnd::Engine(report) => assert_eq!(report.ending, want, "{script}"),
            other => panic!("{script}: {other:?}"),
        }
        assert!(output.logs.is_empty(), "{script}: {:?}", output.logs);
    }
    assert_eq!(sandbox.replaced(), 0, "limits end runs, not workers");
}

#[tokio::test]
async fn the_seed_example_reads_logs_dedupes_and_opens_one_ticket_each() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let catalog = root.join("fixtures/codemode/ops.jsonl");
    let script = std::fs::read_to_string(root.join("fixtures/codemode/triage.ts")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("tickets.log");
    let log_flag = log.display().to_string();
    let config = format!(
        "[gateway]\nmode = \"progressive\"\n\n{}\n{}",
        fixture_server("logs", &catalog, &[], ""),
        fixture_server("tickets", &catalog, &["--count-file", &log_flag], ""),
    );
    let gateway = GatewayProcess::start(&config);
    let client = connect(&gateway.url, None).await;
    let (out, failed) = execute(&client, &script).await;
    assert!(!failed, "{out}");
    assert_eq!(out, "56 error lines, 5 distinct: opened 5 tickets\n");
    assert_eq!(count_requests(&log, "tools/call create_ticket"), 5);
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn promise_all_runs_calls_concurrently_up_to_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = catalog(dir.path());
    let config = format!(
        "[gateway]\nmode = \"progressive\"\n\n[code_mode]\nmax_concurrent_calls = 2\n\n{}",
        fixture_server("tickets", &catalog, &["--delay-ms", "1000"], ""),
    );
    let gateway = GatewayProcess::start(&config);
    let client = connect(&gateway.url, None).await;
    let started = std::time::Instant::now();
    let (out, failed) = execute(
        &client,
        "const all = await Promise.all([1, 2, 3, 4].map(() => tickets.list_tickets({})));\nreturn all.length;",
    )
    .await;
    let elapsed = started.elapsed();
    assert!(!failed, "{out}");
    assert_eq!(out, "Returned: 4\n");
    // Two at a time: two waves of 1 s; one at a time would take 4 s.
    assert!(elapsed >= Duration::from_millis(2000), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(3500), "{elapsed:?}");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn calls_a_script_does_not_await_still_complete_before_the_answer() {
    let setup = start("");
    let client = connect(&setup.gateway.url, None).await;
    let (out, failed) = execute(
        &client,
        "tickets.create_ticket({ title: 'a' });\ntickets.create_ticket({ title: 'b' });\nconsole.log('sent');",
    )
    .await;
    assert!(!failed, "{out}");
    assert_eq!(out, "sent\n");
    assert_eq!(
        count_requests(&setup.tickets_log, "tools/call create_ticket"),
        2
    );
    client.cancel().await.unwrap();
}

fn token(setup: &Setup, name: &str) -> String {
    let created: Value = serde_json::from_str(&cli(
        &setup.gateway.dir.path().join("manifold.toml"),
        &[
            "token", "create", "--name", name, "--action", "discover", "--action", "call",
            "--action", "code", "--json",
        ],
    ))
    .unwrap();
    created["token"].as_str().unwrap().to_string()
}

/// A script that never settles, held until its wall deadline.
const STUCK: &str = "console.log('holding'); await new Promise(() => {});";

/// `execute_code` for `client` in the background.
fn execute_later(client: &Arc<Client>, code: &str) -> tokio::task::JoinHandle<(String, bool)> {
    let client = Arc::clone(client);
    let code = code.to_string();
    tokio::spawn(async move { execute(&client, &code).await })
}

fn busy(out: &str) -> Value {
    let body: Value = serde_json::from_str(out).unwrap_or_else(|_| panic!("not JSON: {out}"));
    assert_eq!(body["error"], "code_mode_busy", "{body}");
    assert!(body["retry_after_ms"].as_u64().unwrap() > 0, "{body}");
    body
}

/// One caller cannot hold every worker: past `max_runs_per_principal` its
/// next run is refused at once with `code_mode_busy`, while another caller
/// still gets a worker.
#[tokio::test]
async fn one_caller_cannot_hold_every_worker() {
    let setup = start(
        "[auth]\nrequired = true\n\n[code_mode]\nworkers = 2\nmax_runs_per_principal = 1\nwall_ms = 15000",
    );
    let (a, b) = (token(&setup, "a"), token(&setup, "b"));
    let alice = Arc::new(connect(&setup.gateway.url, Some(&a)).await);
    let held = execute_later(&alice, STUCK);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let started = std::time::Instant::now();
    let (out, failed) = execute(&alice, "return 1;").await;
    assert!(failed, "{out}");
    assert!(
        busy(&out)["message"]
            .as_str()
            .unwrap()
            .contains("max_runs_per_principal")
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "refused at once, not queued"
    );

    let bob = connect(&setup.gateway.url, Some(&b)).await;
    let (out, failed) = execute(&bob, "return 40 + 2;").await;
    assert!(!failed, "another caller runs: {out}");
    assert!(out.contains("Returned: 42"), "{out}");
    held.abort();
    bob.cancel().await.unwrap();
}

/// The queue is bounded in length and in time: with every worker busy, a
/// run waits at most `queue_timeout_ms`, and past `max_queued` waiting runs
/// the next is refused at once.
#[tokio::test]
async fn the_run_queue_is_bounded_in_length_and_time() {
    let setup = start(
        "[code_mode]\nworkers = 1\nmax_queued = 1\nmax_runs_per_principal = 8\nqueue_timeout_ms = 1500\nwall_ms = 20000",
    );
    let client = Arc::new(connect(&setup.gateway.url, None).await);
    let held = execute_later(&client, STUCK);
    tokio::time::sleep(Duration::from_millis(800)).await;
    // Waits in the queue, then times out.
    let started = std::time::Instant::now();
    let queued = execute_later(&client, "return 1;");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The queue's one place is taken: refused at once.
    let (out, failed) = execute(&client, "return 2;").await;
    assert!(failed, "{out}");
    assert!(
        busy(&out)["message"]
            .as_str()
            .unwrap()
            .contains("max_queued"),
        "{out}"
    );
    let (out, failed) = queued.await.unwrap();
    assert!(failed, "{out}");
    assert!(
        busy(&out)["message"]
            .as_str()
            .unwrap()
            .contains("queue_timeout_ms"),
        "{out}"
    );
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(1400), "{waited:?}");
    assert!(waited < Duration::from_secs(8), "{waited:?}");
    held.abort();
}

/// Code mode fails closed: an isolation layer that is off (here by config)
/// turns `execute_code` into a clear refusal while the rest of the gateway
/// serves; `require_isolation = false` is the explicit opt-out.
#[tokio::test]
async fn code_mode_fails_closed_without_isolation_unless_opted_out() {
    let setup = start("[code_mode]\nlandlock = false");
    let client = connect(&setup.gateway.url, None).await;
    let (out, failed) = execute(&client, "return 1;").await;
    assert!(failed, "{out}");
    assert!(out.contains("landlock"), "{out}");
    assert!(out.contains("require_isolation = false"), "{out}");
    let search = call(&client, "search_tools", json!({"query": "ticket"})).await;
    assert_ne!(search.is_error, Some(true), "{}", text(&search));
    client.cancel().await.unwrap();

    let opted_out = start("[code_mode]\nlandlock = false\nrequire_isolation = false");
    let client = connect(&opted_out.gateway.url, None).await;
    let (out, failed) = execute(&client, "return 3;").await;
    assert!(!failed, "{out}");
    assert!(out.contains("Returned: 3"), "{out}");
    client.cancel().await.unwrap();
}
