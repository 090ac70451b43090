//! Three `manifold serve` processes on one throwaway PostgreSQL, behind a
//! round-robin TCP balancer, driven by one real MCP client: no sticky
//! sessions, a token revoked once fails everywhere, rate limits count
//! across replicas, an approval granted on one replica releases a call
//! waiting on another, and a server enabled or disabled on one replica is
//! enabled or disabled on all.

use crate::common;

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use common::*;
use manifold_store::Backend;
use manifold_test_postgres::TestDatabase;
use rmcp::{
    ServiceExt,
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

/// A TCP load balancer: each new connection goes to the next backend in
/// turn. It records which backend each connection went to.
struct RoundRobin {
    url: String,
    picks: Arc<Mutex<Vec<usize>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RoundRobin {
    async fn start(backends: Vec<SocketAddr>) -> RoundRobin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let picks = Arc::new(Mutex::new(Vec::new()));
        let next = AtomicUsize::new(0);
        let recorded = Arc::clone(&picks);
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let pick = next.fetch_add(1, Ordering::Relaxed) % backends.len();
                recorded.lock().unwrap().push(pick);
                let backend = backends[pick];
                tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(backend).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        RoundRobin { url, picks, task }
    }

    /// The backends picked since `from` connections ago.
    fn picks_since(&self, from: usize) -> Vec<usize> {
        self.picks.lock().unwrap()[from..].to_vec()
    }

    fn connections(&self) -> usize {
        self.picks.lock().unwrap().len()
    }
}

impl Drop for RoundRobin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A real MCP client whose every HTTP request opens a new connection, so
/// the balancer spreads its requests over the replicas.
async fn connect_unpooled(url: &str, token: &str) -> Client {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_string())
        .auth_header(token.to_string());
    let transport = StreamableHttpClientTransport::with_client(http, config);
    ().serve(transport).await.expect("client connects")
}

fn address(url: &str) -> SocketAddr {
    url.trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .parse()
        .unwrap()
}

/// `files`: a read-only tool and a destructive one; `gamma`: one tool, not
/// connected until someone enables it.
fn catalog(dir: &std::path::Path) -> std::path::PathBuf {
    let schema = json!({"type": "object", "properties": {"path": {"type": "string"}}});
    let rows = [
        ("files", "read", json!({"readOnlyHint": true})),
        (
            "files",
            "delete",
            json!({"readOnlyHint": false, "destructiveHint": true}),
        ),
        ("gamma", "echo", json!({"readOnlyHint": true})),
    ];
    let text: String = rows
        .iter()
        .map(|(server, name, annotations)| {
            json!({"id": format!("{server}::{name}"), "server": server, "name": name,
                   "server_description": format!("The {server} server"),
                   "description": format!("{name} something"), "input_schema": schema,
                   "annotations": annotations})
            .to_string()
                + "\n"
        })
        .collect();
    let path = dir.join("tools.jsonl");
    std::fs::write(&path, text).unwrap();
    path
}

const RATE_LIMIT: usize = 4;

async fn call_tool(client: &Client, name: &str) -> rmcp::model::CallToolResult {
    call(
        client,
        "call_tool",
        json!({"name": name, "arguments": {"path": "/tmp/x"}}),
    )
    .await
}

fn refusal(result: &rmcp::model::CallToolResult) -> Option<String> {
    result
        .structured_content
        .as_ref()
        .and_then(|s| s["error"].as_str())
        .map(str::to_string)
}

/// A raw `tools/list` with `token` to one replica: the HTTP status.
async fn status_with(url: &str, token: &str) -> u16 {
    reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_share_one_postgres() {
    let db = TestDatabase::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let tools = catalog(dir.path());
    let files = fixture_server("files", &tools, &[], "");
    let gamma = fixture_server("gamma", &tools, &[], "autoconnect = false");
    let config = format!(
        "[gateway]\nmode = \"progressive\"\n\n[auth]\nrequired = true\n\n\
         [store]\ndatabase_url = {:?}\n\n[governance]\napproval_wait_seconds = 60\n\
         approval_poll_ms = 30000\n\n\
         [search.embedding]\nenabled = false\n\n\
         [[policies]]\nserver = \"files\"\ntool = \"read\"\neffect = \"rate_limit\"\n\
         limit = {RATE_LIMIT}\nwindow_seconds = 86400\n\n\
         [[policies]]\ntier = \"destructive\"\neffect = \"require_approval\"\n\n{files}\n{gamma}",
        db.url()
    );
    // One after the other: the first seeds the config's policies, the
    // others find them there.
    let replicas: Vec<GatewayProcess> = (0..3).map(|_| GatewayProcess::start(&config)).collect();
    let cli_config = replicas[0].dir.path().join("manifold.toml");
    let token = |args: &[&str]| -> Value {
        let mut all = vec!["token", "create", "--json"];
        all.extend_from_slice(args);
        serde_json::from_str(&cli(&cli_config, &all)).unwrap()
    };
    let agent = token(&["--name", "agent"]);
    let agent_token = agent["token"].as_str().unwrap().to_string();
    let admin = token(&["--name", "operator", "--action", "admin"]);
    let admin_token = admin["token"].as_str().unwrap().to_string();

    let balancer = RoundRobin::start(replicas.iter().map(|r| address(&r.url)).collect()).await;
    let client = connect_unpooled(&balancer.url, &agent_token).await;

    // No sticky sessions: one client's requests land on every replica and
    // every one of them answers.
    let before = balancer.connections();
    for _ in 0..3 {
        let found = call(
            &client,
            "search_tools",
            json!({"query": "read", "limit": 5}),
        )
        .await;
        assert_ne!(found.is_error, Some(true), "{}", text(&found));
        assert!(found_names(&json(&found)).contains(&"files__read".to_string()));
    }
    let picks = balancer.picks_since(before);
    for replica in 0..3 {
        assert!(
            picks.contains(&replica),
            "replica {replica} got none of {picks:?}"
        );
    }

    // Rate limits count across replicas: the calls go round-robin, and
    // the limit holds for their sum.
    let before = balancer.connections();
    let mut outcomes = Vec::new();
    for _ in 0..RATE_LIMIT + 2 {
        outcomes.push(refusal(&call_tool(&client, "files__read").await));
    }
    let picks = balancer.picks_since(before);
    for replica in 0..3 {
        assert!(
            picks.contains(&replica),
            "replica {replica} got none of {picks:?}"
        );
    }
    let allowed = outcomes.iter().filter(|o| o.is_none()).count();
    assert_eq!(allowed, RATE_LIMIT, "{outcomes:?}");
    assert_eq!(
        outcomes[RATE_LIMIT..],
        [
            Some("rate_limited".to_string()),
            Some("rate_limited".to_string())
        ],
        "{outcomes:?}"
    );

    // An approval granted on replica 0 releases a call waiting on replica 2.
    let waiting_client = connect(&replicas[2].url, Some(&agent_token)).await;
    let waiting = tokio::spawn(async move {
        let result = call_tool(&waiting_client, "files__delete").await;
        waiting_client.cancel().await.unwrap();
        (result, Instant::now())
    });
    let http = reqwest::Client::new();
    let admin_url = |replica: usize, path: &str| replicas[replica].url.replace("/mcp", path);
    let deadline = Instant::now() + Duration::from_secs(30);
    let pending = loop {
        let listed: Value = http
            .get(admin_url(0, "/admin/approvals"))
            .bearer_auth(&admin_token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let first = listed
            .as_array()
            .or_else(|| listed["approvals"].as_array())
            .and_then(|a| a.first().cloned());
        if let Some(first) = first {
            break first;
        }
        assert!(
            Instant::now() < deadline,
            "no approval request appeared: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(pending["tool"], "files__delete");
    // Let the waiting call settle into its wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the call waits for the approval");
    let approved = http
        .post(admin_url(
            0,
            &format!(
                "/admin/approvals/{}/approve",
                pending["id"].as_str().unwrap()
            ),
        ))
        .bearer_auth(&admin_token)
        .send()
        .await
        .unwrap();
    let approved_at = Instant::now();
    assert!(
        approved.status().is_success(),
        "{}",
        approved.text().await.unwrap()
    );
    let (released, released_at) = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiting call was released")
        .unwrap();
    assert_eq!(refusal(&released), None, "{}", text(&released));
    let approval_latency = released_at - approved_at;
    eprintln!("cross-replica approval release: {approval_latency:?}");
    // An event, not the fallback poll (set to 30 s here), released it.
    assert!(
        approval_latency < Duration::from_secs(5),
        "released after {approval_latency:?}"
    );

    // A server an operator enables on one replica is enabled on all: before,
    // no replica knows gamma's tool; after one admin enable on replica 1,
    // every replica calls it. (A caller's enable_server only changes its own
    // view; tests/one_door.rs covers that.)
    let direct: Vec<Client> =
        futures_join(replicas.iter().map(|r| r.url.clone()), &agent_token).await;
    for (i, replica) in direct.iter().enumerate() {
        let result = call_tool(replica, "gamma__echo").await;
        assert_eq!(
            result.is_error,
            Some(true),
            "replica {i}: {}",
            text(&result)
        );
    }
    let enabled = http
        .post(admin_url(1, "/admin/servers/gamma/enable"))
        .bearer_auth(&admin_token)
        .send()
        .await
        .unwrap();
    assert!(
        enabled.status().is_success(),
        "{}",
        enabled.text().await.unwrap()
    );
    let enabled_at = Instant::now();
    let mut reached = Vec::new();
    for (i, replica) in direct.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let result = call_tool(replica, "gamma__echo").await;
            if result.is_error != Some(true) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "replica {i} never saw gamma: {}",
                text(&result)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        reached.push(enabled_at.elapsed());
    }
    eprintln!(
        "an operator's enable reached every replica within {:?}",
        reached.last().unwrap()
    );

    // And disabled on one, disabled on all.
    let disabled = http
        .post(admin_url(1, "/admin/servers/gamma/disable"))
        .bearer_auth(&admin_token)
        .send()
        .await
        .unwrap();
    assert!(
        disabled.status().is_success(),
        "{}",
        disabled.text().await.unwrap()
    );
    let disabled_at = Instant::now();
    for (i, replica) in direct.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(20);
        while call_tool(replica, "gamma__echo").await.is_error != Some(true) {
            assert!(Instant::now() < deadline, "replica {i} still calls gamma");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    eprintln!(
        "an operator's disable reached every replica within {:?}",
        disabled_at.elapsed()
    );
    for replica in direct {
        replica.cancel().await.unwrap();
    }

    // A token revoked once fails on every replica, at once.
    for replica in &replicas {
        assert_eq!(status_with(&replica.url, &agent_token).await, 200);
    }
    cli(
        &cli_config,
        &["token", "revoke", agent["id"].as_str().unwrap()],
    );
    let revoked_at = Instant::now();
    for replica in &replicas {
        assert_eq!(status_with(&replica.url, &agent_token).await, 401);
    }
    eprintln!(
        "revocation refused on all three replicas within {:?}",
        revoked_at.elapsed()
    );
    let after = client
        .peer()
        .call_tool({
            let mut p = rmcp::model::CallToolRequestParams::new("search_tools");
            p.arguments = json!({"query": "read"}).as_object().cloned();
            p
        })
        .await;
    assert!(after.is_err(), "the revoked client is refused: {after:?}");
}

/// One direct client per replica URL.
async fn futures_join(urls: impl Iterator<Item = String>, token: &str) -> Vec<Client> {
    let mut clients = Vec::new();
    for url in urls {
        clients.push(connect(&url, Some(token)).await);
    }
    clients
}
