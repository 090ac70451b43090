//! Operations end to end on a real `manifold serve`: `/metrics` after real
//! traffic, `/healthz` and `/readyz`, JSON logs that carry no secrets or
//! arguments, SIGTERM draining a slow call, and SIGHUP or a file change
//! reloading `[[servers]]` while a call is in flight.

use crate::common;

use std::{
    path::Path,
    process::ExitStatus,
    time::{Duration, Instant},
};

use common::*;
use serde_json::{Value, json};

/// `alpha` and `beta`, one `echo` tool each (so a config can serve either
/// from one file), and `flaky`, which a test crashes to see a restart.
fn catalog(dir: &Path) -> std::path::PathBuf {
    let schema = json!({"type": "object", "properties": {"text": {"type": "string"}}});
    write_catalog(
        dir,
        "tools.jsonl",
        &[
            ("alpha", "echo", "Echo a text back.", schema.clone()),
            ("beta", "echo", "Echo a text back.", schema.clone()),
            ("flaky", "echo", "Echo a text back.", schema),
        ],
    )
}

fn signal(gw: &GatewayProcess, signal: i32) {
    assert_eq!(unsafe { libc::kill(gw.pid() as i32, signal) }, 0);
}

fn wait_for_exit(gw: &mut GatewayProcess, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = gw.child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the gateway did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `check` every 100 ms for up to a minute.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn get(url: &str, path: &str) -> (u16, String) {
    let response = reqwest::get(url.replace("/mcp", path)).await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

async fn tool_names(client: &Client) -> Vec<String> {
    client
        .peer()
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect()
}

const ARGUMENT_MARKER: &str = "argument-marker-5b1e";

#[tokio::test]
async fn metrics_health_and_json_logs_after_real_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let tools = catalog(dir.path());
    // A TTL, so repeated views hit the catalog cache.
    let alpha = fixture_server("alpha", &tools, &["--ttl-ms", "600000"], "");
    let flaky = fixture_server("flaky", &tools, &["--crash-after-calls", "1"], "");
    // Debug level for Manifold's own crates: secrets must stay out of
    // every line it writes, not only the default ones.
    let mut gw = GatewayProcess::start_with_env(
        &format!(
            "[gateway]\nmode = \"progressive\"\n\n[auth]\nrequired = true\n\n\
             [log]\nformat = \"json\"\n\n[code_mode]\nsandbox = \"in_process\"\n\n{alpha}\n{flaky}"
        ),
        &[("MANIFOLD_LOG", "debug,rmcp=warn")],
    );
    let config = gw.dir.path().join("manifold.toml");
    let token: Value = serde_json::from_str(&cli(
        &config,
        &["token", "create", "--name", "ops", "--json"],
    ))
    .unwrap();
    let token = token["token"].as_str().unwrap().to_string();

    // Health routes need no token, even with auth required.
    assert_eq!(get(&gw.url, "/healthz").await.0, 200);
    let (status, body) = get(&gw.url, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["status"],
        "ready"
    );

    // A refused bearer, then real traffic: a search, a call, a code-mode run.
    let bogus = "mfd_bogus_4c2d9a7e1f";
    let refused = reqwest::Client::new()
        .post(&gw.url)
        .bearer_auth(bogus)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 401);
    let client = connect(&gw.url, Some(&token)).await;
    let found = json(
        &call(
            &client,
            "search_tools",
            json!({"query": format!("echo {ARGUMENT_MARKER}")}),
        )
        .await,
    );
    assert!(found_names(&found).contains(&"alpha__echo".to_string()));
    let echoed = call(
        &client,
        "call_tool",
        json!({"name": "alpha__echo", "arguments": {"text": ARGUMENT_MARKER}}),
    )
    .await;
    assert_ne!(echoed.is_error, Some(true), "{}", text(&echoed));
    let run = call(
        &client,
        "execute_code",
        json!({"code": format!("const r = await alpha.echo({{ text: {ARGUMENT_MARKER:?} }}); console.log('ran');")}),
    )
    .await;
    assert_ne!(run.is_error, Some(true), "{}", text(&run));
    // flaky answers one call and dies on the second; the gateway restarts it.
    for _ in 0..2 {
        let mut params = rmcp::model::CallToolRequestParams::new("call_tool");
        params.arguments = json!({"name": "flaky__echo", "arguments": {"text": "x"}})
            .as_object()
            .cloned();
        let _ = client.peer().call_tool(params).await;
    }

    let expected = [
        "manifold_requests_total{method=\"tools/call\",status=\"2xx\"}",
        "manifold_request_duration_seconds_bucket{method=\"tools/call\",le=\"",
        "manifold_requests_in_flight",
        "manifold_tool_calls_total{server=\"alpha\",tool=\"echo\",outcome=\"ok\"} 2",
        "manifold_tool_call_duration_seconds_bucket{server=\"alpha\",tool=\"echo\",le=\"",
        "manifold_upstream_up{server=\"alpha\"} 1",
        "manifold_upstream_restarts_total{server=\"flaky\"}",
        "manifold_cache_requests_total{cache=\"catalog\",result=\"hit\"}",
        "manifold_cache_requests_total{cache=\"search_index\",result=\"miss\"}",
        "manifold_cache_requests_total{cache=\"code_bindings\",result=\"miss\"}",
        "manifold_cache_requests_total{cache=\"validators\",result=\"miss\"}",
        "manifold_discovery_queue_depth 0",
        "manifold_discovery_refusals_total 0",
        "manifold_code_runs_total{ending=\"completed\"} 1",
        "manifold_code_run_duration_seconds_bucket{le=\"",
        "manifold_approvals_pending 0",
        "# HELP manifold_tool_calls_total",
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    let metrics = loop {
        let (status, body) = get(&gw.url, "/metrics").await;
        let missing: Vec<_> = expected.iter().filter(|s| !body.contains(*s)).collect();
        if status == 200 && missing.is_empty() {
            break body;
        }
        assert!(Instant::now() < deadline, "missing {missing:?} in:\n{body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        !metrics.contains(ARGUMENT_MARKER) && !metrics.contains(&token),
        "{metrics}"
    );
    client.cancel().await.unwrap();

    // Stop the gateway so that every line it wrote has arrived.
    signal(&gw, libc::SIGTERM);
    assert!(wait_for_exit(&mut gw, Duration::from_secs(60)).success());
    let lines: Vec<String> = gw.stderr.try_iter().collect();
    // `mfd_<id>_<secret>`: the secret may itself hold `_`, so it is all
    // after the id, never the last `_`-separated piece (which can be one
    // letter, found in any word of any line).
    let (_, secret) = token
        .strip_prefix("mfd_")
        .and_then(|rest| rest.split_once('_'))
        .expect("a gateway token");
    let mut json_lines = 0;
    for line in &lines {
        for needle in [secret, bogus, ARGUMENT_MARKER] {
            assert!(!line.contains(needle), "{needle:?} logged: {line}");
        }
        if line.starts_with("manifold listening on ") {
            continue;
        }
        let parsed: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        assert!(
            parsed["level"].is_string() && parsed["message"].is_string(),
            "{line}"
        );
        json_lines += 1;
    }
    assert!(json_lines > 3, "{lines:?}");
}

#[tokio::test]
async fn sigterm_drains_a_slow_call_then_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let tools = catalog(dir.path());
    let count = dir.path().join("alpha.count");
    let count_arg = count.display().to_string();
    let alpha = fixture_server(
        "alpha",
        &tools,
        &["--delay-ms", "8000", "--count-file", &count_arg],
        "call_timeout_ms = 120000",
    );
    let mut gw = GatewayProcess::start(&format!(
        "[gateway]\nmode = \"direct\"\ndrain_timeout_ms = 120000\n\n{alpha}"
    ));
    let client = connect(&gw.url, None).await;
    let slow = tokio::spawn(async move {
        let result = call(&client, "alpha__echo", json!({"text": "slow"})).await;
        (client, result)
    });
    eventually("the call to reach the upstream", || {
        let count = count.clone();
        async move { count_requests(&count, "tools/call") == 1 }
    })
    .await;
    let signalled = Instant::now();
    signal(&gw, libc::SIGTERM);

    // New connections are refused while the call is still running.
    let url = gw.url.clone();
    eventually("new connections to be refused", || {
        let url = url.clone();
        async move {
            reqwest::Client::new()
                .get(url.replace("/mcp", "/healthz"))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_err()
        }
    })
    .await;
    assert!(!slow.is_finished(), "the call should still be in flight");

    let (_client, result) = slow.await.unwrap();
    assert_ne!(result.is_error, Some(true), "{}", text(&result));
    let status = wait_for_exit(&mut gw, Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "{status:?}");
    // It waited for the call (the upstream holds each call 8 s).
    assert!(signalled.elapsed() >= Duration::from_secs(3));
}

#[tokio::test]
async fn sighup_and_file_changes_reload_servers_without_failing_calls() {
    let dir = tempfile::tempdir().unwrap();
    let tools = catalog(dir.path());
    let count = dir.path().join("alpha.count");
    let count_arg = count.display().to_string();
    let alpha = fixture_server(
        "alpha",
        &tools,
        &["--delay-ms", "4000", "--count-file", &count_arg],
        "",
    );
    let beta = fixture_server("beta", &tools, &[], "");
    let head = "[gateway]\nmode = \"direct\"\n\n";
    let gw = GatewayProcess::start(&format!("{head}{alpha}"));
    let config = gw.dir.path().join("manifold.toml");
    let client = connect(&gw.url, None).await;
    assert_eq!(tool_names(&client).await, vec!["alpha__echo"]);

    // 1. SIGHUP adds beta while a slow alpha call is in flight.
    let in_flight = |calls: usize| {
        let count = count.clone();
        move || {
            let count = count.clone();
            async move { count_requests(&count, "tools/call") == calls }
        }
    };
    let slow = {
        let client = connect(&gw.url, None).await;
        tokio::spawn(async move { call(&client, "alpha__echo", json!({"text": "one"})).await })
    };
    eventually("the first call to reach alpha", in_flight(1)).await;
    std::fs::write(&config, format!("{head}{alpha}\n{beta}")).unwrap();
    signal(&gw, libc::SIGHUP);
    eventually("beta to appear", || async {
        tool_names(&client)
            .await
            .contains(&"beta__echo".to_string())
    })
    .await;
    let result = call(&client, "beta__echo", json!({"text": "hi"})).await;
    assert_ne!(result.is_error, Some(true), "{}", text(&result));
    let result = slow.await.unwrap();
    assert_ne!(result.is_error, Some(true), "{}", text(&result));

    // 2. A file change alone removes alpha; its call in flight finishes on
    // the old connection.
    let slow = {
        let client = connect(&gw.url, None).await;
        tokio::spawn(async move { call(&client, "alpha__echo", json!({"text": "two"})).await })
    };
    eventually("the second call to reach alpha", in_flight(2)).await;
    std::fs::write(&config, format!("{head}{beta}")).unwrap();
    eventually("alpha to leave", || async {
        tool_names(&client).await == vec!["beta__echo"]
    })
    .await;
    let result = slow.await.unwrap();
    assert_ne!(result.is_error, Some(true), "{}", text(&result));

    // 3. A broken config is refused; the running set stays.
    std::fs::write(
        &config,
        format!("{head}{beta}\n[[servers]]\nname = \"beta\"\n"),
    )
    .unwrap();
    signal(&gw, libc::SIGHUP);
    eventually("the rejection to be logged", || {
        let lines: Vec<String> = gw.stderr.try_iter().collect();
        async move { lines.iter().any(|l| l.contains("config reload rejected")) }
    })
    .await;
    assert_eq!(tool_names(&client).await, vec!["beta__echo"]);
    let result = call(&client, "beta__echo", json!({"text": "still"})).await;
    assert_ne!(result.is_error, Some(true), "{}", text(&result));
    let (_, metrics) = get(&gw.url, "/metrics").await;
    assert!(
        metrics.contains("manifold_config_reloads_total{result=\"rejected\"}"),
        "{metrics}"
    );
}
