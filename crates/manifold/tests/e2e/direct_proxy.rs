//! Direct mode as a complete MCP server: resources, prompts, completions,
//! progress, tool errors and client input pass between a real MCP client and
//! a real upstream (`manifold-fixture conformance` over stdio) through a real
//! `manifold serve`.
#![allow(deprecated)] // Sampling and logging (SEP-2577) are what these tests relay.

use crate::common;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use common::*;
use rmcp::{
    ClientHandler, ClientServiceExt, ErrorData, RoleClient, ServiceExt,
    model::{
        ArgumentInfo, CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig,
        CompleteRequestParams, ElicitRequestParams, ElicitResult, ElicitationAction,
        GetPromptRequestParams, Implementation, LoggingLevel, LoggingMessageNotificationParam,
        ProgressNotificationParam, ProtocolVersion, ReadResourceRequestParams, Reference,
        ResourceContents, SetLevelRequestParams,
    },
    service::{NotificationContext, RequestContext, RunningService},
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde_json::{Value, json};

/// A direct-mode gateway in front of one conformance fixture, `server` by name.
fn gateway(extra_gateway_toml: &str) -> GatewayProcess {
    GatewayProcess::start(&format!(
        "[gateway]\nmode = \"direct\"\n{extra_gateway_toml}\n\n\
         [[servers]]\nname = \"conformance\"\ncommand = {:?}\nargs = [\"conformance\"]\n",
        fixture_bin().display().to_string()
    ))
}

/// A client that records progress and log messages and answers elicitation.
#[derive(Clone, Default)]
struct Recorder {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    logs: Arc<Mutex<Vec<LoggingMessageNotificationParam>>>,
    elicited: Arc<Mutex<Vec<String>>>,
}

impl ClientHandler for Recorder {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params);
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.logs.lock().unwrap().push(params);
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let message = match &request {
            ElicitRequestParams::FormElicitationParams { message, .. } => message.clone(),
            _ => String::new(),
        };
        self.elicited.lock().unwrap().push(message);
        Ok(
            ElicitResult::new(ElicitationAction::Accept).with_content(json!({
                "name": "Alice", "username": "alice", "email": "alice@example.com"
            })),
        )
    }

    fn get_info(&self) -> ClientConfig {
        let capabilities: ClientCapabilities =
            serde_json::from_value(json!({ "elicitation": {} })).unwrap();
        ClientConfig::new(capabilities, Implementation::new("direct-proxy-test", "1"))
    }
}

type Recording = RunningService<RoleClient, Recorder>;

fn transport(url: &str) -> StreamableHttpClientTransport<reqwest::Client> {
    StreamableHttpClientTransport::from_config(StreamableHttpClientTransportConfig::with_uri(
        url.to_string(),
    ))
}

/// A legacy (initialize) client.
async fn legacy_client(url: &str, recorder: Recorder) -> Recording {
    recorder
        .serve(transport(url))
        .await
        .expect("client connects")
}

/// A 2026-07-28 (server/discover, stateless) client.
async fn modern_client(url: &str, recorder: Recorder) -> Recording {
    let lifecycle = rmcp::ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    recorder
        .serve_with_lifecycle(transport(url), lifecycle)
        .await
        .expect("client discovers")
}

fn as_json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap()
}

#[tokio::test]
async fn resources_are_listed_and_read_through_the_gateway() {
    let gw = gateway("");
    let client = connect(&gw.url, None).await;
    let info = client.peer().peer_info().unwrap();
    let caps = as_json(&info.capabilities);
    assert!(caps["resources"].is_object(), "{caps}");
    assert!(caps["prompts"].is_object(), "{caps}");
    assert!(caps["completions"].is_object(), "{caps}");

    let resources = client.peer().list_all_resources().await.unwrap();
    let uris: Vec<&str> = resources.iter().map(|r| r.uri.as_str()).collect();
    assert!(uris.contains(&"test://static-text"), "{uris:?}");
    assert!(uris.contains(&"test://static-binary"), "{uris:?}");

    let text = client
        .peer()
        .read_resource(ReadResourceRequestParams::new("test://static-text"))
        .await
        .unwrap();
    match &text.contents[0] {
        ResourceContents::TextResourceContents {
            uri,
            text,
            mime_type,
            ..
        } => {
            assert_eq!(uri, "test://static-text");
            assert_eq!(mime_type.as_deref(), Some("text/plain"));
            assert!(text.contains("static text resource"), "{text}");
        }
        other => panic!("expected text contents, got {other:?}"),
    }

    // A URI no listing names is routed by the upstream's resource template.
    let templates = client.peer().list_all_resource_templates().await.unwrap();
    assert_eq!(templates[0].uri_template, "test://template/{id}/data");
    let templated = client
        .peer()
        .read_resource(ReadResourceRequestParams::new("test://template/42/data"))
        .await
        .unwrap();
    assert!(
        as_json(&templated.contents[0])
            .to_string()
            .contains("Data for ID: 42")
    );

    // The upstream's own not-found error comes back, with the URI.
    let missing = client
        .peer()
        .read_resource(ReadResourceRequestParams::new("test://nowhere"))
        .await
        .unwrap_err();
    let rmcp::ServiceError::McpError(error) = missing else {
        panic!("expected a JSON-RPC error, got {missing:?}");
    };
    assert_eq!(error.data.unwrap()["uri"], "test://nowhere");
}

#[tokio::test]
async fn prompts_are_listed_qualified_and_fetched_with_completions() {
    let gw = gateway("");
    let client = connect(&gw.url, None).await;
    let prompts = client.peer().list_all_prompts().await.unwrap();
    let names: Vec<&str> = prompts.iter().map(|p| p.name.as_str()).collect();
    assert!(
        names.contains(&"conformance__test_prompt_with_arguments"),
        "{names:?}"
    );
    assert!(
        names.iter().all(|n| n.starts_with("conformance__")),
        "{names:?}"
    );

    let mut params = GetPromptRequestParams::new("conformance__test_prompt_with_arguments");
    params.arguments = json!({"arg1": "first", "arg2": "second"})
        .as_object()
        .cloned();
    let prompt = client.peer().get_prompt(params).await.unwrap();
    let rendered = as_json(&prompt.messages).to_string();
    assert!(rendered.contains("arg1='first'"), "{rendered}");
    assert!(rendered.contains("arg2='second'"), "{rendered}");

    let unknown = client
        .peer()
        .get_prompt(GetPromptRequestParams::new("conformance__no_such_prompt"))
        .await;
    assert!(unknown.is_err());

    let completion = client
        .peer()
        .complete(CompleteRequestParams::new(
            Reference::for_prompt("conformance__test_prompt_with_arguments"),
            ArgumentInfo::new("arg1", "par"),
        ))
        .await
        .unwrap();
    assert_eq!(completion.completion.values, ["paris", "park", "party"]);
}

#[tokio::test]
async fn progress_is_forwarded_under_the_callers_token() {
    let gw = gateway("");
    let recorder = Recorder::default();
    let client = legacy_client(&gw.url, recorder.clone()).await;
    // rmcp gives every request a progress token; the gateway sends the
    // upstream one of its own and maps the notifications back.
    let result = client
        .peer()
        .call_tool(CallToolRequestParams::new(
            "conformance__test_tool_with_progress",
        ))
        .await
        .unwrap();
    assert!(
        text(&result).contains("progress completed"),
        "{}",
        text(&result)
    );
    // Relayed notifications travel beside the result, not ahead of it: allow
    // the last one a moment to land.
    for _ in 0..50 {
        if recorder.progress.lock().unwrap().len() >= 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let progress = recorder.progress.lock().unwrap().clone();
    let values: Vec<f64> = progress.iter().map(|p| p.progress).collect();
    assert_eq!(values, [0.0, 50.0, 100.0], "{progress:?}");
    assert!(progress.iter().all(|p| p.total == Some(100.0)));
    let tokens: std::collections::HashSet<String> = progress
        .iter()
        .map(|p| as_json(&p.progress_token).to_string())
        .collect();
    assert_eq!(tokens.len(), 1, "one token, the caller's: {tokens:?}");
}

/// The JSON-RPC messages of one raw stateless `tools/call`, in the order the
/// gateway wrote them to the response stream.
async fn raw_call_messages(http: &reqwest::Client, url: &str, id: u64, body: Value) -> Vec<Value> {
    let text = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .json(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": body}))
        .send()
        .await
        .expect("the gateway answers")
        .text()
        .await
        .unwrap();
    let messages: Vec<Value> = text
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str(data.trim()).ok())
        .collect();
    assert!(!messages.is_empty(), "no messages in {text:?}");
    messages
}

#[tokio::test]
async fn progress_reaches_the_caller_before_the_result_every_time() {
    // The upstream writes three progress notifications, then the result; a
    // caller that stops reading at the result must already have all three.
    // rmcp hands notifications to spawned tasks, so this raced until they
    // were routed as the upstream transport read them.
    // Eight callers at once keep both cores busy, which is when it raced.
    let gw = gateway("");
    let http = reqwest::Client::new();
    let callers = (0..8u64).map(|caller| {
        let (http, url) = (http.clone(), gw.url.clone());
        tokio::spawn(async move {
            for n in 0..12u64 {
                let id = caller * 100 + n;
                let token = format!("p-{id}");
                let call = json!({
                    "name": "conformance__test_tool_with_progress",
                    "arguments": {},
                    "_meta": {"progressToken": token},
                });
                let messages = raw_call_messages(&http, &url, id, call).await;
                let last = messages.last().unwrap();
                assert_eq!(last["id"], json!(id), "the result comes last: {messages:?}");
                let progress: Vec<f64> = messages
                    .iter()
                    .filter(|m| m["method"] == "notifications/progress")
                    .inspect(|m| assert_eq!(m["params"]["progressToken"], json!(token)))
                    .map(|m| m["params"]["progress"].as_f64().unwrap())
                    .collect();
                assert_eq!(progress, [0.0, 50.0, 100.0], "call {id}: {messages:?}");
            }
        })
    });
    for caller in futures::future::join_all(callers).await {
        caller.expect("every caller saw its progress before its result");
    }
}

#[tokio::test]
async fn log_messages_follow_the_sessions_level() {
    let gw = gateway("legacy_sessions = true");
    let recorder = Recorder::default();
    let client = legacy_client(&gw.url, recorder.clone()).await;
    client
        .peer()
        .set_level(SetLevelRequestParams::new(LoggingLevel::Debug))
        .await
        .unwrap();
    call_on(&client, "conformance__test_tool_with_logging", json!({})).await;
    // As with progress: the last message may land just after the result.
    for _ in 0..100 {
        if recorder.logs.lock().unwrap().len() >= 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let logs = recorder.logs.lock().unwrap().clone();
    assert_eq!(logs.len(), 3, "{logs:?}");
    assert_eq!(logs[0].data, json!("Tool execution started"));
}

/// `common::call` for a client with a handler.
async fn call_on(client: &Recording, tool: &str, args: Value) -> rmcp::model::CallToolResult {
    let mut params = CallToolRequestParams::new(tool.to_string());
    params.arguments = args.as_object().cloned();
    client.peer().call_tool(params).await.unwrap()
}

#[tokio::test]
async fn an_upstream_tool_error_passes_through_unchanged() {
    let gw = gateway("");
    let client = connect(&gw.url, None).await;
    let result = call(&client, "conformance__test_error_handling", json!({})).await;
    assert_eq!(result.is_error, Some(true));
    assert_eq!(
        as_json(&result.content),
        json!([{"type": "text", "text": "This tool intentionally returns an error for testing"}])
    );
}

#[tokio::test]
async fn input_required_passes_through_to_2026_clients() {
    let gw = gateway("");
    let client = modern_client(&gw.url, Recorder::default()).await;
    let tool = "conformance__test_input_required_result_elicitation";
    let first = client
        .peer()
        .call_tool_once(CallToolRequestParams::new(tool))
        .await
        .unwrap();
    let CallToolResponse::InputRequired(asked) = first else {
        panic!("expected input_required, got {first:?}");
    };
    let requests = as_json(&asked.input_requests);
    assert_eq!(
        requests["user_name"]["method"], "elicitation/create",
        "{requests}"
    );

    // The client's retry carries its answers through the gateway.
    let mut retry = CallToolRequestParams::new(tool);
    retry.input_responses = Some(
        serde_json::from_value(json!({
            "user_name": {"action": "accept", "content": {"name": "Bob"}}
        }))
        .unwrap(),
    );
    retry.request_state = asked.request_state.clone();
    let done = client.peer().call_tool_once(retry).await.unwrap();
    let CallToolResponse::Complete(done) = done else {
        panic!("expected a result, got {done:?}");
    };
    assert_eq!(text(&done), "Hello, Bob!");

    // rmcp's own MRTR driver answers through the client handler.
    let driven = client
        .call_tool(CallToolRequestParams::new(tool))
        .await
        .unwrap();
    assert_eq!(text(&driven), "Hello, Alice!");

    // A tampered requestState is the upstream's JSON-RPC error, not a result.
    let tampered_tool = "conformance__test_input_required_result_tampered_state";
    let CallToolResponse::InputRequired(asked) = client
        .peer()
        .call_tool_once(CallToolRequestParams::new(tampered_tool))
        .await
        .unwrap()
    else {
        panic!("expected input_required");
    };
    let mut tampered = CallToolRequestParams::new(tampered_tool);
    tampered.request_state = asked.request_state.map(|s| format!("{s}-TAMPERED"));
    tampered.input_responses = Some(
        serde_json::from_value(json!({"confirm": {"action": "accept", "content": {"ok": true}}}))
            .unwrap(),
    );
    let error = client.peer().call_tool_once(tampered).await.unwrap_err();
    assert!(
        matches!(&error, rmcp::ServiceError::McpError(e) if e.code.0 == -32602),
        "{error:?}"
    );
}

#[tokio::test]
async fn legacy_clients_are_asked_the_upstreams_questions_in_their_session() {
    let gw = gateway("legacy_sessions = true");
    let recorder = Recorder::default();
    let client = legacy_client(&gw.url, recorder.clone()).await;
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        call_on(
            &client,
            "conformance__test_elicitation",
            json!({"message": "Who are you?"}),
        ),
    )
    .await
    .expect("the elicitation round trip finishes");
    assert!(
        text(&result).contains("alice@example.com"),
        "{}",
        text(&result)
    );
    assert_eq!(*recorder.elicited.lock().unwrap(), ["Who are you?"]);
}

#[tokio::test]
async fn sessions_are_off_by_default_and_on_when_configured() {
    let off = gateway("");
    let response = reqwest::Client::new().get(&off.url).send().await.unwrap();
    assert_eq!(response.status(), 405);
    assert_eq!(response.headers()["allow"], "POST");
    let on = gateway("legacy_sessions = true");
    let response = reqwest::Client::new().delete(&on.url).send().await.unwrap();
    assert_ne!(response.status(), 405);
}

#[tokio::test]
async fn cancelling_a_call_cancels_the_upstream_request() {
    // A legacy client in a session (sends `notifications/cancelled`) and a
    // 2026-07-28 client (closes its stream, which on that wire cancels).
    // A legacy client without a session can only hang up, which on that wire
    // is not a cancellation: `a_disconnected_call_still_completes_upstream_and_is_audited`.
    for (sessions, modern) in [(true, false), (false, true)] {
        cancel_once(sessions, modern).await;
    }
}

async fn cancel_once(sessions: bool, modern: bool) {
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
            "--hang-call",
            "get_alerts",
            "--count-file",
            count.to_str().unwrap(),
        ],
        "",
    );
    let gw = GatewayProcess::start(&format!(
        "[gateway]\nmode = \"direct\"\nlegacy_sessions = {sessions}\n\n{server}"
    ));
    let client = if modern {
        modern_client(&gw.url, Recorder::default()).await
    } else {
        legacy_client(&gw.url, Recorder::default()).await
    };
    let request = rmcp::model::ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(
        CallToolRequestParams::new("weather__get_alerts"),
    ));
    let handle = client
        .peer()
        .send_cancellable_request(request, rmcp::service::PeerRequestOptions::no_options())
        .await
        .unwrap();
    let case = format!("sessions={sessions} modern={modern}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while count_requests(&count, "tools/call get_alerts") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{case}: the call never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    handle.cancel(Some("changed my mind".into())).await.unwrap();
    while count_requests(&count, "notifications/cancelled") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{case}: the upstream request was never cancelled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An operator's `require_approval` is the operator's: the gated caller's
/// own client is never asked, so it cannot approve its own call (before,
/// an `accept` without `approve: true` counted as yes).
#[tokio::test]
async fn a_held_call_is_never_offered_to_the_callers_own_user() {
    let gw = gateway(
        "legacy_sessions = true\n\n[governance]\napproval_wait_seconds = 2\n\n\
         [[policies]]\nserver = \"conformance\"\ntool = \"test_tool_with_logging\"\neffect = \"require_approval\"",
    );
    let recorder = Recorder::default();
    let client = legacy_client(&gw.url, recorder.clone()).await;
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        call_on(&client, "conformance__test_tool_with_logging", json!({})),
    )
    .await
    .expect("the wait ends");
    assert_eq!(result.is_error, Some(true), "{}", text(&result));
    assert!(
        text(&result).contains("approval_required"),
        "{}",
        text(&result)
    );
    let asked = recorder.elicited.lock().unwrap().clone();
    assert!(asked.is_empty(), "the caller's client was asked: {asked:?}");
    let out = std::process::Command::new(manifold_bin())
        .args(["audit", "export", "--kind", "activity", "--config"])
        .arg(gw.dir.path().join("manifold.toml"))
        .output()
        .unwrap();
    let rows = String::from_utf8_lossy(&out.stdout);
    assert!(!rows.contains("\"decision\":\"approved\""), "{rows}");
}
