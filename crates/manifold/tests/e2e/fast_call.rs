//! The fast call path (`crates/server/src/http/fast_call.rs`) and the plain
//! upstream POST (`crates/upstream/src/plain/`) answer exactly as rmcp does.
//! Two gateways share one store and one upstream, one with `fast_calls` and
//! the server's `plain_calls` on and one with both off; every request below
//! goes to both, and the replies (status, content type, body) must match
//! byte for byte, as must the activity audit each caller leaves. The metrics
//! show which requests took the fast path, so a path that never ran cannot
//! pass; the upstream crate's tests show which path an upstream call took.

use crate::common;

use common::*;
use serde_json::{Value, json};

fn catalog(dir: &std::path::Path) -> std::path::PathBuf {
    let message = json!({"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]});
    write_catalog(
        dir,
        "echo.jsonl",
        &[
            ("echo", "say", "Say the message back.", message.clone()),
            ("echo", "shout", "Say the message back, loudly.", message),
        ],
    )
}

fn config(data: &std::path::Path, upstream: &str, fast: bool) -> String {
    format!(
        "[gateway]\nmode = \"direct\"\nfast_calls = {fast}\n\n[auth]\nrequired = true\n\n\
         [code_mode]\nenabled = false\n\n[store]\ndata_dir = {:?}\n\n\
         [[policies]]\nprincipal = \"group:agents\"\nserver = \"echo\"\ntool = \"shout\"\neffect = \"deny\"\n\n\
         [[servers]]\nname = \"echo\"\nurl = {upstream:?}\nplain_calls = {fast}\n",
        data.display().to_string()
    )
}

/// One request: headers besides auth, and the body.
struct Case {
    what: &'static str,
    headers: Vec<(&'static str, &'static str)>,
    body: Value,
    /// Whether the fast path should answer it.
    fast: bool,
}

const LEGACY: (&str, &str) = ("mcp-protocol-version", "2025-11-25");
const ACCEPT: (&str, &str) = ("accept", "application/json, text/event-stream");

fn call(id: Value, tool: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments}})
}

fn cases() -> Vec<Case> {
    let hi = json!({"message": "hi"});
    let mut with_trace = call(json!(8), "echo__say", hi.clone());
    with_trace["params"]["_meta"] =
        json!({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"});
    let mut with_progress = call(json!(9), "echo__say", hi.clone());
    with_progress["params"]["_meta"] = json!({"progressToken": "p-1"});
    let mut modern = call(json!(10), "echo__say", hi.clone());
    modern["params"]["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}
    });
    let mut retry = call(json!(13), "echo__say", hi.clone());
    retry["params"]["requestState"] = json!("opaque");
    let plain = |what, body| Case {
        what,
        headers: vec![ACCEPT, LEGACY],
        body,
        fast: true,
    };
    vec![
        plain("a result", call(json!(1), "echo__say", hi.clone())),
        plain("a string id", call(json!("abc"), "echo__say", hi.clone())),
        plain("invalid arguments", call(json!(2), "echo__say", json!({}))),
        plain(
            "a policy refusal",
            call(json!(3), "echo__shout", hi.clone()),
        ),
        plain("an unknown tool", call(json!(4), "echo__sya", hi.clone())),
        plain("a trace context", with_trace),
        Case {
            what: "no protocol version header",
            headers: vec![ACCEPT],
            body: call(json!(5), "echo__say", hi.clone()),
            fast: true,
        },
        Case {
            what: "an older protocol version",
            headers: vec![ACCEPT, ("mcp-protocol-version", "2025-06-18")],
            body: call(json!(6), "echo__say", hi.clone()),
            fast: true,
        },
        Case {
            what: "a progress token (rmcp's)",
            headers: vec![ACCEPT, LEGACY],
            body: with_progress,
            fast: false,
        },
        Case {
            what: "a 2026-07-28 request (rmcp's)",
            headers: vec![
                ACCEPT,
                ("mcp-protocol-version", "2026-07-28"),
                ("mcp-method", "tools/call"),
                ("mcp-name", "echo__say"),
            ],
            body: modern,
            fast: false,
        },
        Case {
            what: "an MRTR retry (rmcp's)",
            headers: vec![ACCEPT, LEGACY],
            body: retry,
            fast: false,
        },
        Case {
            what: "an Accept without event streams (rmcp's 406)",
            headers: vec![("accept", "application/json"), LEGACY],
            body: call(json!(11), "echo__say", hi.clone()),
            fast: false,
        },
        Case {
            what: "an unknown protocol version (rmcp's 400)",
            headers: vec![ACCEPT, ("mcp-protocol-version", "2099-01-01")],
            body: call(json!(12), "echo__say", hi.clone()),
            fast: false,
        },
        Case {
            what: "a session id (rmcp's)",
            headers: vec![ACCEPT, LEGACY, ("mcp-session-id", "nope")],
            body: call(json!(14), "echo__say", hi),
            fast: false,
        },
        Case {
            what: "the call_tool meta-tool (rmcp's)",
            headers: vec![ACCEPT, LEGACY],
            body: call(
                json!(15),
                "call_tool",
                json!({"name": "echo__say", "arguments": {"message": "hi"}}),
            ),
            fast: false,
        },
    ]
}

async fn send(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    case: &Case,
) -> (u16, String, String) {
    let mut request = http
        .post(url)
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(case.body.to_string());
    for (name, value) in &case.headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, content_type, response.text().await.unwrap())
}

fn fast_calls_counted(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("manifold_fast_calls_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

async fn metrics(http: &reqwest::Client, gateway_url: &str) -> String {
    let url = gateway_url.replace("/mcp", "/metrics");
    http.get(url).send().await.unwrap().text().await.unwrap()
}

/// What the activity audit says of one principal's calls, in order.
fn audit_of(rows: &[Value], principal: &str) -> Vec<Value> {
    rows.iter()
        .filter(|r| r["principal"] == principal)
        .map(|r| {
            json!([
                r["tool"],
                r["decision"],
                r["outcome"],
                r["args_hash"],
                r["details"]["refusal"],
                r["details"]["kind"]
            ])
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fast_path_answers_byte_for_byte_as_rmcp_does() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = HttpFixture::start(&catalog(dir.path()), "echo", &dir.path().join("count"));
    let data = dir.path().join("data");
    let fast = GatewayProcess::start(&config(&data, &upstream.url, true));
    let slow = GatewayProcess::start(&config(&data, &upstream.url, false));
    let path = fast.dir.path().join("manifold.toml");
    let token = |name: &str| -> (String, String) {
        let created: Value = serde_json::from_str(&cli(
            &path,
            &[
                "token", "create", "--name", name, "--action", "discover", "--action", "call",
                "--group", "agents", "--json",
            ],
        ))
        .unwrap();
        let field = |key: &str| created[key].as_str().unwrap().to_string();
        (field("token"), format!("token:{}", field("id")))
    };
    let ((fast_token, fast_principal), (slow_token, slow_principal)) =
        (token("via-fast"), token("via-rmcp"));
    // The tokens were made by another process: wait out the governance window.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let http = reqwest::Client::new();
    let mut expected_fast = 0;
    for case in cases() {
        let before = fast_calls_counted(&metrics(&http, &fast.url).await);
        let a = send(&http, &fast.url, &fast_token, &case).await;
        let b = send(&http, &slow.url, &slow_token, &case).await;
        assert_eq!(a, b, "{}: the two paths answered differently", case.what);
        let took = fast_calls_counted(&metrics(&http, &fast.url).await) - before;
        assert_eq!(
            took,
            u64::from(case.fast),
            "{}: fast path taken {took} times",
            case.what
        );
        expected_fast += u64::from(case.fast);
    }
    assert!(expected_fast >= 8);
    assert_eq!(
        fast_calls_counted(&metrics(&http, &slow.url).await),
        0,
        "with fast_calls off nothing takes the fast path"
    );
    // Both callers left the same activity trail.
    let parse = |out: &str| -> Vec<Value> {
        out.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let out = cli_until(&path, &["audit", "export", "--kind", "activity"], |out| {
        let rows = parse(out);
        audit_of(&rows, &fast_principal) == audit_of(&rows, &slow_principal)
    });
    let rows = parse(&out);
    let (a, b) = (
        audit_of(&rows, &fast_principal),
        audit_of(&rows, &slow_principal),
    );
    assert!(a.len() >= 8, "the fast caller's calls are audited: {a:?}");
    assert_eq!(a, b, "the two paths audit alike");
}

/// `/mcp` is served under the paths it always was (`/mcp`, `/mcp/`,
/// `/mcp/…`), and the guard and the pipeline stand in front of each: a
/// foreign `Host` and a missing token are refused on every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mcp_path_has_the_guard_and_the_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = HttpFixture::start(&catalog(dir.path()), "echo", &dir.path().join("count"));
    let gateway = GatewayProcess::start(&config(&dir.path().join("data"), &upstream.url, true));
    let path = gateway.dir.path().join("manifold.toml");
    let created: Value = serde_json::from_str(&cli(
        &path,
        &[
            "token", "create", "--name", "paths", "--action", "discover", "--action", "call",
            "--json",
        ],
    ))
    .unwrap();
    let token = created["token"].as_str().unwrap().to_string();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let http = reqwest::Client::new();
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}).to_string();
    let post = |url: String| {
        http.post(url)
            .header("content-type", "application/json")
            .header(ACCEPT.0, ACCEPT.1)
            .header(LEGACY.0, LEGACY.1)
            .body(ping.clone())
    };
    for suffix in ["", "/", "/anything"] {
        let url = format!("{}{suffix}", gateway.url);
        let answered = post(url.clone()).bearer_auth(&token).send().await.unwrap();
        assert_eq!(answered.status(), 200, "{url}");
        let body: Value = answered.json().await.unwrap();
        assert_eq!(body["id"], 1, "{url}: {body}");
        let anonymous = post(url.clone()).send().await.unwrap();
        assert_eq!(anonymous.status(), 401, "{url}: no token");
        let foreign = post(url.clone())
            .bearer_auth(&token)
            .header("host", "attacker.example")
            .send()
            .await
            .unwrap();
        assert_eq!(foreign.status(), 403, "{url}: foreign host");
    }
}
