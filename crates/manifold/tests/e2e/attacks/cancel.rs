//! One client sends `notifications/cancelled` for another client's call,
//! guessing its request id. The call is not cancelled: calls in flight are
//! keyed by the caller's identity and session, not by a display name that
//! every anonymous caller shares.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;

/// How long the upstream takes to answer: the other client's cancel lands
/// well inside it.
const CALL_DELAY_MS: u64 = 5000;

/// A legacy client speaking raw HTTP in its own session, so that the test
/// chooses the request ids.
struct RawSession {
    http: reqwest::Client,
    url: String,
    token: Option<String>,
    session: String,
}

impl RawSession {
    async fn open(url: &str, token: Option<&str>) -> RawSession {
        let http = reqwest::Client::new();
        let mut session = RawSession {
            http,
            url: url.to_string(),
            token: token.map(str::to_string),
            session: String::new(),
        };
        let response = session
            .post(
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "cancel-attack", "version": "1"}}}),
            )
            .await;
        assert_eq!(response.status(), 200);
        session.session = response.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_string();
        let initialized = session
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert_eq!(initialized.status(), 202);
        session
    }

    async fn post(&self, body: Value) -> reqwest::Response {
        let mut request = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .body(body.to_string());
        if !self.session.is_empty() {
            request = request.header("mcp-session-id", &self.session);
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        request.send().await.unwrap()
    }

    /// The JSON-RPC answer to request `id`, from a JSON or an SSE body.
    async fn answer(&self, body: Value) -> Value {
        let id = body["id"].clone();
        let response = self.post(body).await;
        assert_eq!(response.status(), 200);
        let text = response.text().await.unwrap();
        let messages: Vec<Value> = match serde_json::from_str(&text) {
            Ok(message) => vec![message],
            Err(_) => text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|data| serde_json::from_str(data.trim()).ok())
                .collect(),
        };
        messages
            .into_iter()
            .find(|m| m["id"] == id)
            .unwrap_or_else(|| panic!("no answer to {id} in {text}"))
    }
}

/// Client A calls a slow tool as request 7; client B, in its own session
/// (and with its own token when `auth`), cancels request 7. A's call must
/// still succeed, and the upstream must see no cancellation.
async fn another_client_cannot_cancel(auth: bool) {
    let dir = tempfile::tempdir().unwrap();
    let catalog = write_catalog(
        dir.path(),
        "tools.jsonl",
        &[(
            "weather",
            "get_alerts",
            "Active severe weather alerts for a region.",
            json!({"type": "object", "properties": {}}),
        )],
    );
    let count = dir.path().join("requests.log");
    let server = fixture_server(
        "weather",
        &catalog,
        &[
            "--delay-ms",
            &CALL_DELAY_MS.to_string(),
            "--count-file",
            count.to_str().unwrap(),
        ],
        "",
    );
    let auth_toml = if auth {
        "[auth]\nrequired = true\n\n"
    } else {
        ""
    };
    let gw = GatewayProcess::start(&format!(
        "[gateway]\nmode = \"direct\"\nlegacy_sessions = true\n\n{auth_toml}{server}"
    ));
    let token = |name: &str| -> Option<String> {
        auth.then(|| {
            let created: Value = serde_json::from_str(&cli(
                &gw.dir.path().join("manifold.toml"),
                &["token", "create", "--name", name, "--json"],
            ))
            .unwrap();
            created["token"].as_str().unwrap().to_string()
        })
    };
    let (token_a, token_b) = (token("alice"), token("bob"));
    let case = format!("auth={auth}");

    let alice = RawSession::open(&gw.url, token_a.as_deref()).await;
    let bob = RawSession::open(&gw.url, token_b.as_deref()).await;
    let call = tokio::spawn(async move {
        let answer = alice
            .answer(json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "weather__get_alerts", "arguments": {}}}))
            .await;
        (answer, Instant::now())
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while count_requests(&count, "tools/call get_alerts") == 0 {
        assert!(
            Instant::now() < deadline,
            "{case}: the call never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cancel = bob
        .post(
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 7, "reason": "not yours"}}),
        )
        .await;
    assert_eq!(cancel.status(), 202, "{case}");
    // A request in B's session after its cancel: the cancel has been read.
    let listed = bob
        .answer(json!({"jsonrpc": "2.0", "id": 8, "method": "tools/list"}))
        .await;
    assert!(listed["result"]["tools"].is_array(), "{case}: {listed}");
    let cancel_sent = Instant::now();

    let (answer, answered_at) = tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .expect("A's call is answered")
        .unwrap();
    assert!(
        answer["error"].is_null(),
        "{case}: B cancelled A's call: {answer}"
    );
    assert_ne!(answer["result"]["isError"], true, "{case}: {answer}");
    assert!(
        answered_at > cancel_sent,
        "{case}: A's call ended before B's cancel was in; the delay is too short for this machine"
    );
    assert_eq!(
        count_requests(&count, "notifications/cancelled"),
        0,
        "{case}: the upstream call was cancelled"
    );
}

#[tokio::test]
async fn another_session_cannot_cancel_a_call_with_auth_off() {
    another_client_cannot_cancel(false).await;
}

#[tokio::test]
async fn another_token_cannot_cancel_a_call() {
    another_client_cannot_cancel(true).await;
}
