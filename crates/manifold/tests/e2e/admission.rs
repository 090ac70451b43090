//! Admission control for discovery, over real HTTP: a real `manifold serve`
//! in front of a fixture upstream whose listings are private (so every
//! caller's listing goes upstream) and slow (so listings overlap).

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use futures::future::join_all;
use serde_json::{Value, json};

/// `n` tools for one server, each with a small schema.
fn many_tools(dir: &std::path::Path, n: usize) -> std::path::PathBuf {
    let rows: Vec<(String, String)> = (0..n)
        .map(|i| {
            (
                format!("tool_{i:03}"),
                format!("Tool number {i} does thing {i}."),
            )
        })
        .collect();
    let rows: Vec<(&str, &str, &str, Value)> = rows
        .iter()
        .map(|(name, description)| {
            (
                "big",
                name.as_str(),
                description.as_str(),
                json!({"type": "object", "properties": {"q": {"type": "string"}}}),
            )
        })
        .collect();
    write_catalog(dir, "tools.jsonl", &rows)
}

fn gateway(
    dir: &std::path::Path,
    tools: usize,
    list_delay_ms: u64,
    admission: &str,
) -> GatewayProcess {
    let catalog = many_tools(dir, tools);
    let delay = list_delay_ms.to_string();
    let server = fixture_server(
        "big",
        &catalog,
        &["--cache-scope", "private", "--list-delay-ms", &delay],
        "",
    );
    GatewayProcess::start(&format!(
        "[gateway]\nmode = \"direct\"\n\n[admission]\n{admission}\n\n{server}"
    ))
}

/// One raw stateless `tools/list` as caller `who` (an opaque bearer, so each
/// caller has its own private listing).
async fn list(http: &reqwest::Client, url: &str, who: usize) -> reqwest::Response {
    http.post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .bearer_auth(format!("caller-{who}"))
        .json(&json!({"jsonrpc": "2.0", "id": who, "method": "tools/list", "params": {}}))
        .send()
        .await
        .expect("the gateway answers")
}

async fn metric(http: &reqwest::Client, url: &str, name: &str) -> f64 {
    let text = http
        .get(url.replace("/mcp", "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| {
            let (key, value) = line.split_once(' ')?;
            (key == name).then(|| value.trim().parse().ok())?
        })
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
}

async fn wait_for_metric(http: &reqwest::Client, url: &str, name: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let value = metric(http, url, name).await;
        if value == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} stayed at {value}, wanted {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn sixteen_concurrent_listings_all_succeed_some_after_queueing() {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), 500, 150, "max_active = 2\nmax_queued = 32");
    let http = reqwest::Client::new();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (http, url, done) = (http.clone(), gw.url.clone(), done.clone());
        tokio::spawn(async move {
            let mut deepest = 0.0f64;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                deepest = deepest.max(metric(&http, &url, "manifold_discovery_queue_depth").await);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            deepest
        })
    };
    let responses = join_all((0..16).map(|i| {
        let (http, url) = (http.clone(), gw.url.clone());
        async move {
            let response = list(&http, &url, i).await;
            let status = response.status();
            let body: Value = response.json().await.unwrap();
            (status, body)
        }
    }))
    .await;
    for (status, body) in &responses {
        assert_eq!(status.as_u16(), 200, "{body}");
        assert_eq!(body["result"]["tools"].as_array().map(Vec::len), Some(500));
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let deepest = watcher.await.unwrap();
    assert!(
        deepest >= 1.0,
        "some listings waited in the queue (deepest {deepest})"
    );
    assert_eq!(
        metric(&http, &gw.url, "manifold_discovery_refusals_total").await,
        0.0
    );
    let queued = json!(metric(&http, &gw.url, "manifold_discovery_queue_depth").await);
    assert_eq!(queued, json!(0.0), "the queue drained");
}

#[tokio::test]
async fn beyond_the_queue_discovery_gets_503_and_leavers_free_their_places() {
    let dir = tempfile::tempdir().unwrap();
    // Listings take 20 s: whoever gets in holds its slot for the whole test.
    let gw = gateway(
        dir.path(),
        50,
        20_000,
        "max_active = 2\nmax_queued = 32\nretry_after_seconds = 3",
    );
    let http = reqwest::Client::new();
    let holders: Vec<_> = (0..34)
        .map(|i| {
            let (http, url) = (http.clone(), gw.url.clone());
            tokio::spawn(async move { list(&http, &url, i).await.status() })
        })
        .collect();
    wait_for_metric(&http, &gw.url, "manifold_discovery_queue_depth", 32.0).await;
    assert_eq!(
        metric(&http, &gw.url, "manifold_discovery_active").await,
        2.0
    );

    let refused = list(&http, &gw.url, 35).await;
    assert_eq!(refused.status().as_u16(), 503);
    assert_eq!(
        refused
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("3")
    );
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["id"], 35);
    assert_eq!(body["error"]["data"]["code"], "tool_discovery_busy");
    assert_eq!(
        metric(&http, &gw.url, "manifold_discovery_refusals_total").await,
        1.0
    );

    // Anything but discovery passes while discovery is full.
    let call = http
        .post(&gw.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .json(&json!({"jsonrpc": "2.0", "id": 99, "method": "ping"}))
        .send()
        .await
        .unwrap();
    assert_eq!(call.status().as_u16(), 200);

    // Queued clients that hang up leave the queue.
    for holder in &holders {
        holder.abort();
    }
    wait_for_metric(&http, &gw.url, "manifold_discovery_queue_depth", 0.0).await;
    wait_for_metric(&http, &gw.url, "manifold_discovery_active", 0.0).await;
    drop(gw);
}

#[tokio::test]
async fn a_disconnected_call_still_completes_upstream_and_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = many_tools(dir.path(), 3);
    let count = dir.path().join("requests.log");
    let server = fixture_server(
        "big",
        &catalog,
        &[
            "--delay-ms",
            "1500",
            "--count-file",
            count.to_str().unwrap(),
        ],
        "",
    );
    let gw = GatewayProcess::start(&format!("[gateway]\nmode = \"direct\"\n\n{server}"));
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(400))
        .build()
        .unwrap();
    let sent = impatient
        .post(&gw.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "big__tool_001", "arguments": {"q": "still wanted"}}}))
        .send()
        .await;
    assert!(sent.is_err(), "the client gave up before the answer");

    let config = gw.dir.path().join("manifold.toml");
    let deadline = Instant::now() + Duration::from_secs(20);
    let row = loop {
        let out = std::process::Command::new(manifold_bin())
            .args(["audit", "export", "--kind", "activity", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rows: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if let Some(row) = rows.into_iter().find(|r| r["tool"] == "big__tool_001") {
            break row;
        }
        assert!(
            Instant::now() < deadline,
            "no activity row for the abandoned call"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(row["outcome"], "success", "{row}");
    assert_eq!(row["decision"], "allowed");
    assert!(row["latency_ms"].as_u64().unwrap() >= 1500, "{row}");
    assert_eq!(count_requests(&count, "notifications/cancelled"), 0);
}

/// docs/configuration.md states this bound for the restart burst below.
const BURST_PEAK_RSS_MIB: u64 = 256;

fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib / 1024
}

#[tokio::test]
async fn restart_burst_of_200_listings_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    // Every caller has its own private listing, as after a restart with a
    // cold cache: the worst case for the gateway.
    let gw = gateway(dir.path(), 500, 20, "max_active = 2\nmax_queued = 32");
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let started = Instant::now();
    let answers = join_all((0..200).map(|i| {
        let (http, url) = (http.clone(), gw.url.clone());
        async move {
            let response = list(&http, &url, i).await;
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            (status, body)
        }
    }))
    .await;
    let elapsed = started.elapsed();
    let (mut listed, mut busy) = (0, 0);
    for (status, body) in &answers {
        match status {
            200 => {
                assert_eq!(
                    body["result"]["tools"].as_array().map(Vec::len),
                    Some(500),
                    "{body}"
                );
                listed += 1;
            }
            503 => {
                assert_eq!(
                    body["error"]["data"]["code"], "tool_discovery_busy",
                    "{body}"
                );
                busy += 1;
            }
            other => panic!("unexpected status {other}: {body}"),
        }
    }
    assert_eq!(listed + busy, 200);
    assert!(
        listed >= 34,
        "at least the admitted and queued listings finish: {listed}"
    );
    let peak = peak_rss_mib(gw.pid());
    eprintln!(
        "restart burst: {listed} listed, {busy} busy (503) in {elapsed:?}; gateway peak RSS {peak} MiB"
    );
    assert!(peak < BURST_PEAK_RSS_MIB, "peak RSS {peak} MiB");
}
