//! Faults: a real gateway in front of a steady upstream and a hostile one
//! (`manifold-fixture hostile`, which breaks the protocol on purpose). For each
//! fault the gateway stays up, the steady server answers at once, the hostile
//! server's trouble shows in `search_available_servers`, and every call has
//! exactly one activity row.

use crate::common;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use common::*;
use serde_json::{Value, json};

/// The hostile server's call timeout; "one timeout" in the assertions below.
const CALL_TIMEOUT_MS: u64 = 2000;

struct Hostile {
    gw: GatewayProcess,
    steady_count: PathBuf,
    victim_count: PathBuf,
    _dir: tempfile::TempDir,
}

fn hostile_entry(name: &str, count: &Path, flags: &[&str], extra_toml: &str) -> String {
    let mut args = vec![
        "hostile".to_string(),
        "--count-file".to_string(),
        count.display().to_string(),
    ];
    args.extend(flags.iter().map(|s| s.to_string()));
    format!(
        "[[servers]]\nname = {name:?}\ndescription = \"The {name} server\"\ncommand = {:?}\nargs = {}\n\
         list_timeout_ms = {CALL_TIMEOUT_MS}\n{extra_toml}\n",
        fixture_bin().display().to_string(),
        serde_json::to_string(&args).unwrap()
    )
}

/// A gateway with `steady` (no fault) and `victim` (`--fault FAULT`).
fn start(fault: &str, flags: &[&str], gateway_toml: &str) -> Hostile {
    start_custom(fault, flags, gateway_toml, &default_timeout())
}

fn default_timeout() -> String {
    format!("call_timeout_ms = {CALL_TIMEOUT_MS}")
}

fn start_custom(fault: &str, flags: &[&str], gateway_toml: &str, victim_toml: &str) -> Hostile {
    let dir = tempfile::tempdir().unwrap();
    let steady_count = dir.path().join("steady.count");
    let victim_count = dir.path().join("victim.count");
    let mut victim_flags = vec!["--fault", fault];
    victim_flags.extend_from_slice(flags);
    let config = format!(
        "[gateway]\nmode = \"progressive\"\n\n{gateway_toml}\n\n{}\n{}",
        hostile_entry("steady", &steady_count, &[], &default_timeout()),
        hostile_entry("victim", &victim_count, &victim_flags, victim_toml),
    );
    Hostile {
        gw: GatewayProcess::start(&config),
        steady_count,
        victim_count,
        _dir: dir,
    }
}

impl Hostile {
    fn config_path(&self) -> PathBuf {
        self.gw.dir.path().join("manifold.toml")
    }

    fn base_url(&self) -> String {
        self.gw.url.trim_end_matches("/mcp").to_string()
    }

    async fn assert_alive(&self) {
        let health = reqwest::get(format!("{}/healthz", self.base_url()))
            .await
            .expect("the gateway answers /healthz");
        assert_eq!(health.status(), 200);
    }

    /// Activity rows by tool, once `expected` rows have been written (the
    /// audit is written after the answer), then checked to stay that way.
    fn activity(&self, expected: usize) -> Vec<Value> {
        let read = || -> Vec<Value> {
            cli(
                &self.config_path(),
                &["audit", "export", "--kind", "activity"],
            )
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while read().len() < expected && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(300));
        read()
    }
}

async fn call_tool(client: &Client, name: &str, args: Value) -> rmcp::model::CallToolResult {
    call(
        client,
        "call_tool",
        json!({"name": name, "arguments": args}),
    )
    .await
}

async fn victim_status(client: &Client) -> Value {
    let servers = json(
        &call(
            client,
            "search_available_servers",
            json!({"query": "victim"}),
        )
        .await,
    );
    servers["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "victim")
        .cloned()
        .expect("victim is listed")
}

/// Number of activity rows for `tool`.
fn rows_for(rows: &[Value], tool: &str) -> usize {
    rows.iter().filter(|r| r["tool"] == tool).count()
}

/// The shape every call fault shares: `victim__trigger` misbehaves while
/// `steady__echo` is called; the trigger fails cleanly within one timeout.
async fn call_fault(fault: &str, flags: &[&str], error_says: &[&str]) -> (Hostile, Value) {
    call_fault_within(
        fault,
        flags,
        error_says,
        &default_timeout(),
        CALL_TIMEOUT_MS,
    )
    .await
}

async fn call_fault_within(
    fault: &str,
    flags: &[&str],
    error_says: &[&str],
    victim_toml: &str,
    timeout_ms: u64,
) -> (Hostile, Value) {
    let h = start_custom(fault, flags, "", victim_toml);
    let client = connect(&h.gw.url, None).await;
    // Warm both listings so the timing below measures calls only.
    call(&client, "search_tools", json!({"query": "echo"})).await;

    let peer = client.peer().clone();
    let started = Instant::now();
    let trigger = tokio::spawn(async move {
        let mut params = rmcp::model::CallToolRequestParams::new("call_tool");
        params.arguments = json!({"name": "victim__trigger", "arguments": {}})
            .as_object()
            .cloned();
        let result = peer.call_tool(params).await;
        (result, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    let echo_started = Instant::now();
    let echo = call_tool(&client, "steady__echo", json!({"text": "still here"})).await;
    let echo_took = echo_started.elapsed();
    assert_ne!(echo.is_error, Some(true), "{}", text(&echo));
    assert!(text(&echo).contains("still here"), "{}", text(&echo));
    assert!(
        echo_took < Duration::from_millis(1000),
        "steady waited {echo_took:?} during {fault}"
    );

    let (result, took) = trigger.await.unwrap();
    let result = result.expect("the fault comes back as a tool result, not a broken session");
    assert_eq!(result.is_error, Some(true), "{fault}: {}", text(&result));
    let message = text(&result);
    assert!(
        error_says.iter().any(|s| message.contains(s)),
        "{fault}: {message}"
    );
    assert!(
        took < Duration::from_millis(timeout_ms + 3000),
        "{fault}: the trigger took {took:?}"
    );

    h.assert_alive().await;
    let status = victim_status(&client).await;
    let rows = h.activity(2);
    assert_eq!(rows_for(&rows, "victim__trigger"), 1, "{fault}: {rows:?}");
    assert_eq!(rows_for(&rows, "steady__echo"), 1, "{fault}: {rows:?}");
    assert_eq!(rows.len(), 2, "{fault}: {rows:?}");
    assert_eq!(count_requests(&h.victim_count, "tools/call trigger"), 1);
    (h, status)
}

fn last_error(status: &Value) -> String {
    status["last_error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_crash_mid_call_fails_that_call_and_the_server_restarts() {
    let (h, status) = call_fault("crash-mid-call", &[], &["closed", "connection"]).await;
    assert!(last_error(&status).contains("tools/call"), "{status}");
    // The supervisor restarts it, and it serves again.
    let client = connect(&h.gw.url, None).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let echo = call_tool(&client, "victim__echo", json!({"text": "back"})).await;
        if echo.is_error != Some(true) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "victim never came back: {}",
            text(&echo)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let status = victim_status(&client).await;
    assert!(status["restarts"].as_u64().unwrap() >= 1, "{status}");
}

#[tokio::test]
async fn a_hung_call_times_out_and_the_server_keeps_serving() {
    let (h, status) = call_fault("hang", &[], &["did not answer"]).await;
    assert!(last_error(&status).contains("tools/call"), "{status}");
    let client = connect(&h.gw.url, None).await;
    let echo = call_tool(&client, "victim__echo", json!({"text": "other calls"})).await;
    assert_ne!(echo.is_error, Some(true), "{}", text(&echo));
}

#[tokio::test]
async fn a_slow_drip_is_cut_off_at_the_timeout() {
    let (_h, status) = call_fault("slow-drip", &[], &["did not answer"]).await;
    assert!(last_error(&status).contains("tools/call"), "{status}");
}

#[tokio::test]
async fn a_huge_result_is_refused_with_its_size() {
    // 50 MB on stdio: the transport drops a line over 16 MB unread into
    // memory, and the call ends at its timeout.
    call_fault("huge-result", &[], &["did not answer"]).await;
    // Under the transport's bound, the gateway's own limit refuses it by size.
    let (_h, status) = call_fault_within(
        "huge-result",
        &["--result-mb", "12"],
        &["too large"],
        "call_timeout_ms = 30000\nmax_result_bytes = 8388608",
        30_000,
    )
    .await;
    assert!(last_error(&status).contains("12.0 MB"), "{status}");
}

#[tokio::test]
async fn malformed_json_fails_the_call_cleanly() {
    let (_h, status) = call_fault(
        "malformed-json",
        &[],
        &["closed", "did not answer", "parse", "connection"],
    )
    .await;
    assert!(!last_error(&status).is_empty(), "{status}");
}

#[tokio::test]
async fn a_reply_under_the_wrong_id_is_not_taken_for_the_answer() {
    let (_h, status) = call_fault("wrong-id", &[], &["did not answer"]).await;
    assert!(last_error(&status).contains("tools/call"), "{status}");
}

/// A listing fault: the steady server's tools are found at once, and the
/// victim's trouble is named.
async fn steady_is_found(h: &Hostile, client: &Client) -> Value {
    let started = Instant::now();
    let found = json(&call(client, "search_tools", json!({"query": "echo arguments"})).await);
    let took = started.elapsed();
    assert!(
        found_names(&found).contains(&"steady__echo".to_string()),
        "{found}"
    );
    assert!(
        took < Duration::from_millis(CALL_TIMEOUT_MS + 1000),
        "search took {took:?}"
    );
    h.assert_alive().await;
    found
}

#[tokio::test]
async fn a_cursor_loop_is_cut_off_and_named() {
    let h = start("cursor-loop", &[], "");
    let client = connect(&h.gw.url, None).await;
    steady_is_found(&h, &client).await;
    let status = victim_status(&client).await;
    assert!(
        status["listing_error"]
            .as_str()
            .unwrap_or_default()
            .contains("cursor"),
        "{status}"
    );
    // Cut off after a bounded number of pages.
    assert!(count_requests(&h.victim_count, "tools/list") <= 200);
}

#[tokio::test]
async fn a_list_changed_storm_is_coalesced() {
    let h = start(
        "list-changed-storm",
        &["--storm-per-sec", "1000", "--storm-secs", "4"],
        "",
    );
    let client = connect(&h.gw.url, None).await;
    let until = Instant::now() + Duration::from_secs(4);
    let mut searches = 0;
    while Instant::now() < until {
        steady_is_found(&h, &client).await;
        let echo = call_tool(&client, "steady__echo", json!({"text": "storm"})).await;
        assert_ne!(echo.is_error, Some(true), "{}", text(&echo));
        searches += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(searches >= 10, "only {searches} searches in 4 s");
    // 4,000 notifications; listings follow requests (a search and a call
    // each see the catalog at most once), not notifications.
    let lists = count_requests(&h.victim_count, "tools/list");
    assert!(
        lists <= 2 * searches + 5,
        "{lists} listings for {searches} searches and calls"
    );
    let rows = h.activity(searches);
    assert_eq!(rows_for(&rows, "steady__echo"), searches);
}

#[tokio::test]
async fn a_rug_pull_quarantines_the_changed_tool_before_the_upstream_sees_a_call() {
    let h = start("rug-pull", &[], "");
    let client = connect(&h.gw.url, None).await;
    steady_is_found(&h, &client).await;
    // The operator approves the echo they saw in the first listing.
    cli(&h.config_path(), &["tools", "approve", "victim", "echo"]);
    // The victim announced a change after its listing; the next search re-lists.
    tokio::time::sleep(Duration::from_millis(500)).await;
    steady_is_found(&h, &client).await;
    assert!(
        count_requests(&h.victim_count, "tools/list") >= 2,
        "the victim was not listed again"
    );
    let echo = call_tool(&client, "victim__echo", json!({"text": "x"})).await;
    assert_eq!(echo.is_error, Some(true), "{}", text(&echo));
    assert!(text(&echo).contains("quarantined"), "{}", text(&echo));
    assert_eq!(count_requests(&h.victim_count, "tools/call"), 0);
    let steady = call_tool(&client, "steady__echo", json!({"text": "fine"})).await;
    assert_ne!(steady.is_error, Some(true), "{}", text(&steady));
    let rows = h.activity(2);
    assert_eq!(rows_for(&rows, "victim__echo"), 1, "{rows:?}");
    assert_eq!(rows_for(&rows, "steady__echo"), 1, "{rows:?}");
}

#[tokio::test]
async fn a_one_megabyte_schema_is_indexed_without_harm() {
    let h = start("huge-schema", &[], "");
    let client = connect(&h.gw.url, None).await;
    steady_is_found(&h, &client).await;
    let found = json(
        &call(
            &client,
            "search_tools",
            json!({"query": "1 MB input schema"}),
        )
        .await,
    );
    let names = found_names(&found);
    let status = victim_status(&client).await;
    assert!(
        names.contains(&"victim__huge_schema".to_string()) || status["listing_error"].is_string(),
        "neither indexed nor named: {found} {status}"
    );
    // The search answer stays small whatever the schema size.
    assert!(
        found.to_string().len() < 64 * 1024,
        "{}",
        found.to_string().len()
    );
}

#[tokio::test]
async fn odd_tool_names_are_kept_out_or_made_safe() {
    let h = start("odd-names", &[], "");
    let client = connect(&h.gw.url, None).await;
    steady_is_found(&h, &client).await;
    let found = json(
        &call(
            &client,
            "search_tools",
            json!({"query": "oddly named tool", "limit": 50}),
        )
        .await,
    );
    for name in found_names(&found) {
        assert!(
            name.len() <= 128
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)),
            "unsafe qualified name {name:?}"
        );
        assert!(
            name.len() <= 64,
            "qualified name over 64 characters: {name:?}"
        );
    }
    let status = victim_status(&client).await;
    // Nine odd names (one a duplicate, dropped), echo and trigger.
    assert_eq!(status["tools"], 10, "{status}");
    // The ranking may add the ordinary tools; every odd one is there.
    let names: Vec<String> = found_names(&found)
        .into_iter()
        .filter(|n| {
            n.starts_with("victim__") && !["victim__trigger", "victim__echo"].contains(&n.as_str())
        })
        .collect();
    assert_eq!(names.len(), 8, "{names:?}");
    // A made-safe name still reaches the upstream under its own name.
    let spaced = names
        .iter()
        .find(|n| n.starts_with("victim__has_space"))
        .expect("the spaced name is offered");
    call_tool(&client, spaced, json!({})).await;
    assert_eq!(count_requests(&h.victim_count, "tools/call has space"), 1);
    let echo = call_tool(&client, "victim__echo", json!({"text": "odd"})).await;
    assert_ne!(echo.is_error, Some(true), "{}", text(&echo));
}

#[tokio::test]
async fn the_same_tool_names_on_two_servers_reach_their_own_server() {
    let h = start("none", &[], "");
    let client = connect(&h.gw.url, None).await;
    for (tool, n) in [("steady__echo", 2), ("victim__echo", 3)] {
        for _ in 0..n {
            let r = call_tool(&client, tool, json!({"text": tool})).await;
            assert!(text(&r).contains(tool), "{}", text(&r));
        }
    }
    assert_eq!(count_requests(&h.steady_count, "tools/call echo"), 2);
    assert_eq!(count_requests(&h.victim_count, "tools/call echo"), 3);
    let rows = h.activity(5);
    assert_eq!(rows_for(&rows, "steady__echo"), 2);
    assert_eq!(rows_for(&rows, "victim__echo"), 3);
}

/// A stdio server slower to start than rmcp's 10 s `server/discover` probe
/// (as an `npx` server on a cold cache is) is started again with
/// `initialize` and served, instead of failing on the late answer to the
/// probe.
#[tokio::test]
async fn a_server_slower_to_start_than_the_discover_probe_is_connected() {
    let dir = tempfile::tempdir().unwrap();
    let schema = json!({"type": "object"});
    let catalog = write_catalog(
        dir.path(),
        "slow.jsonl",
        &[("slow", "ping", "Ping.", schema)],
    );
    let gw = GatewayProcess::start(&format!(
        "[gateway]\nmode = \"direct\"\n\n{}",
        fixture_server(
            "slow",
            &catalog,
            &["--start-delay-ms", "11000"],
            "connect_timeout_ms = 45000"
        ),
    ));
    let client = connect(&gw.url, None).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let tools = client.peer().list_all_tools().await.unwrap();
        if tools.iter().any(|t| t.name == "slow__ping") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slow server was never served"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let answer = call(&client, "slow__ping", json!({})).await;
    assert_ne!(answer.is_error, Some(true), "{}", text(&answer));
}
