//! The request path's promises, on real processes over loopback: every call
//! whose reply was sent has its audit row when the gateway is killed; a
//! clean stop commits every row; calls reuse keep-alive connections to the
//! upstream; and a change the CLI makes reaches a running gateway within
//! the governance window.

use crate::common;

use std::{
    collections::HashSet,
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use common::*;
use manifold_store::{AuditKind, Store, hash_arguments};
use serde_json::{Value, json};

fn echo_catalog(dir: &Path) -> std::path::PathBuf {
    write_catalog(
        dir,
        "echo.jsonl",
        &[
            (
                "echo",
                "say",
                "Say the message back.",
                json!({"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}),
            ),
            (
                "echo",
                "shout",
                "Say the message back, loudly.",
                json!({"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}),
            ),
        ],
    )
}

/// A direct-mode gateway in front of one HTTP upstream, its store in `data`.
fn config(data: &Path, upstream: &str, auth: bool, governance: &str) -> String {
    format!(
        "[gateway]\nmode = \"direct\"\n\n[auth]\nrequired = {auth}\n\n[code_mode]\nenabled = false\n\n\
         [governance]\n{governance}\n\n[store]\ndata_dir = {:?}\n\n\
         [[servers]]\nname = \"echo\"\nurl = {upstream:?}\n",
        data.display().to_string()
    )
}

fn message_of(n: u64) -> Value {
    json!({ "message": format!("m{n}") })
}

/// One stateless `tools/call`: the HTTP status, except 298 for a tool error
/// (`isError`), 299 for a JSON-RPC error, and 0 when no reply came.
async fn call(http: &reqwest::Client, url: &str, bearer: Option<&str>, tool: &str, n: u64) -> u16 {
    let body = json!({"jsonrpc": "2.0", "id": n, "method": "tools/call",
        "params": {"name": tool, "arguments": message_of(n)}});
    let mut request = http
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .json(&body);
    if let Some(bearer) = bearer {
        request = request.bearer_auth(bearer);
    }
    match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            match response.text().await {
                Ok(text) if status == 200 && !text.contains("\"result\"") => 299,
                Ok(text) if status == 200 && text.contains("\"isError\":true") => 298,
                Ok(_) => status,
                Err(_) => 0,
            }
        }
        Err(_) => 0,
    }
}

/// `callers` loops of calls until `stop`; the numbers of the calls whose
/// reply (a result) arrived.
fn start_load(url: &str, callers: u64, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<u64>> {
    let url = url.to_string();
    tokio::spawn(async move {
        let replied = Arc::new(Mutex::new(Vec::new()));
        let http = reqwest::Client::new();
        let tasks: Vec<_> = (0..callers)
            .map(|worker| {
                let (url, http, stop, replied) = (
                    url.clone(),
                    http.clone(),
                    Arc::clone(&stop),
                    Arc::clone(&replied),
                );
                tokio::spawn(async move {
                    let mut n = worker * 1_000_000;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        match call(&http, &url, None, "echo__say", n).await {
                            200 => replied.lock().unwrap().push(n),
                            0 => tokio::time::sleep(Duration::from_millis(5)).await,
                            _ => {}
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            let _ = task.await;
        }
        replied.lock().unwrap().clone()
    })
}

/// The hashes of the audited calls' arguments. Every call of the load has
/// its own arguments, so a row written twice (a journal replayed twice)
/// fails here.
async fn audited_hashes(data: &Path) -> HashSet<String> {
    let store = Store::open_data_dir(data).await.unwrap();
    let rows = store.audit_export(AuditKind::Activity, 0).await.unwrap();
    store.close().await;
    let hashes: HashSet<String> = rows
        .iter()
        .filter_map(|r| r["args_hash"].as_str().map(str::to_string))
        .collect();
    assert_eq!(hashes.len(), rows.len(), "a call audited twice");
    hashes
}

/// The audit journals in `data` (one per gateway process that has not
/// stopped cleanly and been followed by another opener).
fn journals(data: &Path) -> usize {
    std::fs::read_dir(data.join("manifold.db.audit-journal")).map_or(0, |dir| dir.flatten().count())
}

fn missing(replied: &[u64], audited: &HashSet<String>) -> Vec<u64> {
    replied
        .iter()
        .copied()
        .filter(|n| !audited.contains(&hash_arguments(&message_of(*n))))
        .collect()
}

/// Waits for the stopped load; asserts that it ran and that every call it
/// had a reply to has its audit row. Returns the replies and the audit.
async fn every_reply_audited(
    load: tokio::task::JoinHandle<Vec<u64>>,
    data: &Path,
    when: &str,
) -> (Vec<u64>, HashSet<String>) {
    let replied = load.await.unwrap();
    assert!(
        replied.len() > 50,
        "the load ran: {} replies",
        replied.len()
    );
    let audited = audited_hashes(data).await;
    let lost = missing(&replied, &audited);
    assert!(
        lost.is_empty(),
        "{} of {} replied calls have no audit row {when}: {:?}",
        lost.len(),
        replied.len(),
        &lost[..lost.len().min(10)]
    );
    (replied, audited)
}

fn wait_exit(gateway: &mut GatewayProcess, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = gateway.child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "the gateway did not stop in {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reply_sent_before_a_sigkill_has_its_audit_row() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = HttpFixture::start(&echo_catalog(dir.path()), "echo", &dir.path().join("count"));
    let data = dir.path().join("data");
    let mut gateway = GatewayProcess::start(&config(&data, &upstream.url, false, ""));
    let stop = Arc::new(AtomicBool::new(false));
    let load = start_load(&gateway.url, 8, Arc::clone(&stop));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // SIGKILL: no drain, no flush, nothing in the gateway runs after this.
    gateway.child.kill().unwrap();
    gateway.child.wait().unwrap();
    stop.store(true, Ordering::Relaxed);
    // Replies went out once their rows were in the journal; the killed
    // process's journal is written by the next opener of the database.
    assert_eq!(journals(&data), 1, "the killed gateway left its journal");
    every_reply_audited(load, &data, "after a SIGKILL").await;
    assert_eq!(
        journals(&data),
        0,
        "the next opener wrote it and deleted it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_commits_every_row_even_when_replies_do_not_wait() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = HttpFixture::start(&echo_catalog(dir.path()), "echo", &dir.path().join("count"));
    let data = dir.path().join("data");
    let mut gateway = GatewayProcess::start(&config(
        &data,
        &upstream.url,
        false,
        "audit_commit = \"async\"",
    ));
    assert!(
        gateway
            .startup
            .iter()
            .any(|l| l.contains("governance.audit_commit")),
        "async commit is a warning at start: {:?}",
        gateway.startup
    );
    let stop = Arc::new(AtomicBool::new(false));
    let load = start_load(&gateway.url, 8, Arc::clone(&stop));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // SAFETY: signalling a child process we own.
    unsafe { libc::kill(gateway.pid() as i32, libc::SIGTERM) };
    let status = wait_exit(&mut gateway, Duration::from_secs(30));
    assert!(status.success(), "a clean stop: {status}");
    stop.store(true, Ordering::Relaxed);
    let (replied, audited) = every_reply_audited(load, &data, "after a SIGTERM").await;
    // Calls in flight when the signal came were drained and recorded too:
    // nothing was recorded that was not a call of this load.
    assert!(audited.len() >= replied.len());
}

/// TCP sockets in this network namespace whose remote end is `port`, by
/// state (hex, as `/proc/net/tcp` writes it: 01 established, 06 time-wait).
fn sockets_to(port: u16, state: &str) -> usize {
    let remote = format!(":{port:04X}");
    let mut count = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        count += text
            .lines()
            .skip(1)
            .filter(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                f.len() > 3 && f[2].ends_with(&remote) && f[3] == state
            })
            .count();
    }
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_reuse_keep_alive_connections_to_the_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = HttpFixture::start(&echo_catalog(dir.path()), "echo", &dir.path().join("count"));
    let port: u16 = upstream
        .url
        .rsplit(':')
        .next()
        .and_then(|p| p.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap();
    let gateway =
        GatewayProcess::start(&config(&dir.path().join("data"), &upstream.url, false, ""));
    let http = reqwest::Client::new();
    let time_wait_before = sockets_to(port, "06");
    let mut tasks = Vec::new();
    for worker in 0..4u64 {
        let (http, url) = (http.clone(), gateway.url.clone());
        tasks.push(tokio::spawn(async move {
            let mut ok = 0;
            for n in 0..100 {
                ok +=
                    u32::from(call(&http, &url, None, "echo__say", worker * 1000 + n).await == 200);
            }
            ok
        }));
    }
    let mut ok = 0;
    for task in tasks {
        ok += task.await.unwrap();
    }
    assert_eq!(ok, 400, "every call answered");
    // Without keep-alive every call would leave its connection in
    // TIME_WAIT on the gateway's side; with it, a handful stay open.
    let established = sockets_to(port, "01");
    let time_wait = sockets_to(port, "06").saturating_sub(time_wait_before);
    assert!(
        time_wait < 20,
        "{time_wait} connections to the upstream closed during 400 calls"
    );
    assert!(
        (1..=2 * 8).contains(&established),
        "{established} connections to the upstream held open"
    );
}

/// Polls `refused` every 2 ms; how long it took to hold.
async fn time_until<F, Fut>(what: &str, refused: F) -> Duration
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        if refused().await {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("{what} never reached the gateway");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_made_by_the_cli_reach_a_running_gateway_within_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = HttpFixture::start(&echo_catalog(dir.path()), "echo", &dir.path().join("count"));
    let path = dir.path().join("manifold.toml");
    std::fs::write(
        &path,
        config(&dir.path().join("data"), &upstream.url, true, ""),
    )
    .unwrap();
    let gateway = GatewayProcess::start_file(&path, &[]);
    let http = reqwest::Client::new();
    let url = gateway.url.clone();
    let mut windows = Vec::new();
    for round in 0..3 {
        // A revocation.
        let created = cli(&path, &["token", "create", "--name", &format!("r{round}")]);
        let (id, secret) = (
            line_value(&created, "id:").to_string(),
            line_value(&created, "token:").to_string(),
        );
        assert_eq!(call(&http, &url, Some(&secret), "echo__say", 1).await, 200);
        cli(&path, &["token", "revoke", &id]);
        windows.push(
            time_until("the revocation", || async {
                call(&http, &url, Some(&secret), "echo__say", 2).await == 401
            })
            .await,
        );

        // A policy change.
        let created = cli(&path, &["token", "create", "--name", &format!("p{round}")]);
        let (id, secret) = (
            line_value(&created, "id:").to_string(),
            line_value(&created, "token:").to_string(),
        );
        assert_eq!(
            call(&http, &url, Some(&secret), "echo__shout", 3).await,
            200
        );
        cli(
            &path,
            &[
                "policy",
                "add",
                "--effect",
                "deny",
                "--principal",
                &format!("token:{id}"),
                "--tool",
                "shout",
            ],
        );
        windows.push(
            time_until("the deny policy", || async {
                call(&http, &url, Some(&secret), "echo__shout", 4).await != 200
            })
            .await,
        );

        // A quarantine, then the approval of the same definition.
        assert_eq!(call(&http, &url, Some(&secret), "echo__say", 5).await, 200);
        cli(&path, &["tools", "quarantine", "echo", "say"]);
        windows.push(
            time_until("the quarantine", || async {
                call(&http, &url, Some(&secret), "echo__say", 6).await != 200
            })
            .await,
        );
        // The definition stored now is the one reviewed.
        cli(&path, &["tools", "approve", "echo", "say"]);
        windows.push(
            time_until("the approval", || async {
                call(&http, &url, Some(&secret), "echo__say", 7).await == 200
            })
            .await,
        );
    }
    windows.sort();
    let median = windows[windows.len() / 2];
    eprintln!("windows from the change to its effect: {windows:?}");
    assert!(
        median <= Duration::from_millis(50),
        "median {median:?} of {windows:?}"
    );
    assert!(
        windows.iter().all(|w| *w <= Duration::from_millis(1000)),
        "{windows:?}"
    );
}
