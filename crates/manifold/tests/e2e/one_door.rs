//! One door (issue 17): every request a caller sends is decided by the
//! broker before anything upstream happens, in both protocol eras and both
//! modes.
//!
//! The set-up is the one the bypasses were found with: auth required, an
//! `agent` token with `discover` and `call` scoped to `time__*`, and a deny
//! policy on server `everything` (for the agent's group, so that an
//! `operator` token shows what the agent's listings leave out). `time` is a
//! `manifold-fixture` catalog server; `everything` is npm's
//! `@modelcontextprotocol/server-everything` behind a wrapper that records
//! that it started and every line it was sent, so a test can show that a
//! refused request never reached it. Each refusal is also looked up in the
//! activity audit, with its request kind.
#![allow(deprecated)] // logging/setLevel and resources/subscribe are legacy MCP.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;
use rmcp::{
    ClientServiceExt, ServiceError, ServiceExt,
    model::{
        ArgumentInfo, CompleteRequestParams, GetPromptRequestParams, LoggingLevel, ProtocolVersion,
        ReadResourceRequestParams, Reference, SetLevelRequestParams, SubscribeRequestParams,
        SubscriptionFilter, UnsubscribeRequestParams,
    },
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde_json::{Value, json};

const STATIC_URI: &str = "demo://resource/static/document/features.md";
const TEMPLATE: &str = "demo://resource/dynamic/text/{resourceId}";
const TEMPLATED_URI: &str = "demo://resource/dynamic/text/1";

/// npm's server-everything, installed by `scripts/install-test-deps.sh`.
pub(crate) fn everything_bin() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/npm/node_modules/.bin/mcp-server-everything");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/install-test-deps.sh",
        path.display()
    );
    path
}

/// The two protocol eras a client may speak, and the legacy era over the
/// legacy HTTP+SSE transport.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Era {
    /// 2025-11-25: `initialize`, sessions when the gateway keeps them.
    Legacy,
    /// 2026-07-28: `server/discover`, stateless.
    Modern,
    /// 2025-11-25 over `/sse` and `/messages` (raw requests only).
    LegacySse,
}

const ERAS: [Era; 2] = [Era::Legacy, Era::Modern];

struct Setup {
    gw: GatewayProcess,
    /// discover + call, scoped to `time__*`, in group `agents`.
    agent: String,
    agent_id: String,
    /// Every action, every scope.
    operator: String,
    /// Every line the `everything` server was sent.
    everything_in: PathBuf,
    /// A line per start of the `everything` server.
    everything_started: PathBuf,
    _dir: tempfile::TempDir,
}

/// A gateway in `mode` with the set-up above. `legacy_sessions`: 2025
/// clients get sessions (subscriptions and log levels live in them).
fn start(mode: &str, legacy_sessions: bool, everything_autoconnect: bool) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let catalog = write_catalog(
        dir.path(),
        "time.jsonl",
        &[(
            "time",
            "get_current_time",
            "The current time in a time zone.",
            json!({"type": "object", "properties": {"timezone": {"type": "string"}}}),
        )],
    );
    let everything_in = dir.path().join("everything.in");
    let everything_started = dir.path().join("everything.started");
    let wrapper = dir.path().join("everything.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho started >> '{}'\ntee -a '{}' | exec '{}'\n",
            everything_started.display(),
            everything_in.display(),
            everything_bin().display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = format!(
        "[gateway]\nmode = {mode:?}\nlegacy_sessions = {legacy_sessions}\n\n\
         [auth]\nrequired = true\n\n[governance]\napproval_wait_seconds = 0\n\n\
         [code_mode]\nsandbox = \"in_process\"\nworkers = 1\n\n\
         [[policies]]\nprincipal = \"group:agents\"\nserver = \"everything\"\ntool = \"*\"\neffect = \"deny\"\n\n\
         {}\n\
         [[servers]]\nname = \"everything\"\ndescription = \"Every MCP feature\"\ncommand = {:?}\n\
         autoconnect = {everything_autoconnect}\n",
        fixture_server("time", &catalog, &[], ""),
        wrapper.display().to_string(),
    );
    let gw = GatewayProcess::start(&config);
    let path = gw.dir.path().join("manifold.toml");
    let agent: Value = serde_json::from_str(&cli(
        &path,
        &[
            "token", "create", "--name", "agent", "--action", "discover", "--action", "call",
            "--scope", "time__*", "--group", "agents", "--json",
        ],
    ))
    .unwrap();
    let operator: Value = serde_json::from_str(&cli(
        &path,
        &[
            "token", "create", "--name", "operator", "--action", "discover", "--action", "call",
            "--action", "code", "--action", "admin", "--json",
        ],
    ))
    .unwrap();
    Setup {
        gw,
        agent: agent["token"].as_str().unwrap().to_string(),
        agent_id: agent["id"].as_str().unwrap().to_string(),
        operator: operator["token"].as_str().unwrap().to_string(),
        everything_in,
        everything_started,
        _dir: dir,
    }
}

impl Setup {
    fn config(&self) -> PathBuf {
        self.gw.dir.path().join("manifold.toml")
    }

    fn base(&self) -> String {
        self.gw.url.trim_end_matches("/mcp").to_string()
    }

    async fn client(&self, token: &str, era: Era) -> Client {
        let config = StreamableHttpClientTransportConfig::with_uri(self.gw.url.clone())
            .auth_header(token.to_string());
        let transport = StreamableHttpClientTransport::from_config(config);
        match era {
            Era::Legacy => ().serve(transport).await.expect("client initializes"),
            Era::LegacySse => panic!("rmcp has no SSE client: `raw` speaks SSE"),
            Era::Modern => {
                let lifecycle = rmcp::ClientLifecycleMode::Discover {
                    preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                };
                ().serve_with_lifecycle(transport, lifecycle)
                    .await
                    .expect("client discovers")
            }
        }
    }

    /// The agent's refusals of `kind` naming `tool` in the activity audit,
    /// once one says `refusal` (or at the deadline).
    fn refusals(&self, kind: &str, tool: &str, refusal: &str) -> Vec<Value> {
        let matching = |out: &str| -> Vec<Value> {
            out.lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .filter(|r| {
                    r["details"]["kind"] == kind
                        && r["tool"] == tool
                        && r["principal"] == format!("token:{}", self.agent_id)
                        && r["outcome"] == "not_forwarded"
                        && r["decision"] != "allowed"
                })
                .collect()
        };
        let out = cli_until(
            &self.config(),
            &["audit", "export", "--kind", "activity"],
            |out| {
                matching(out)
                    .iter()
                    .any(|r| r["details"]["refusal"] == refusal)
            },
        );
        matching(&out)
    }

    /// Asserts that the agent's refusal of `kind` naming `tool` is in the
    /// activity audit with `refusal` as its reason.
    fn assert_audited(&self, kind: &str, tool: &str, refusal: &str) {
        let rows = self.refusals(kind, tool, refusal);
        assert!(
            rows.iter().any(|r| r["details"]["refusal"] == refusal),
            "no {refusal} row for {kind} {tool} in the activity audit: {rows:?}"
        );
    }

    /// What the `everything` server was sent, JSON-RPC method by method.
    fn everything_methods(&self) -> Vec<String> {
        std::fs::read_to_string(&self.everything_in)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|m| m["method"].as_str().map(str::to_string))
            .collect()
    }

    fn assert_everything_never_got(&self, methods: &[&str]) {
        let got = self.everything_methods();
        for method in methods {
            assert!(
                !got.iter().any(|m| m == method),
                "{method} reached the everything server: {got:?}"
            );
        }
    }
}

/// The refusal code in a JSON-RPC error from the gateway.
fn refusal_of(error: ServiceError) -> String {
    match error {
        ServiceError::McpError(error) => error
            .data
            .as_ref()
            .and_then(|d| d["error"].as_str())
            .unwrap_or_else(|| panic!("an error without a refusal: {error:?}"))
            .to_string(),
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

fn prompt_completion(name: &str) -> CompleteRequestParams {
    CompleteRequestParams::new(
        Reference::for_prompt(name),
        ArgumentInfo::new("department", "E"),
    )
}

fn template_completion() -> CompleteRequestParams {
    CompleteRequestParams::new(
        Reference::for_resource(TEMPLATE),
        ArgumentInfo::new("resourceId", "1"),
    )
}

/// Prompts, resources, templates and completions in direct mode, for a
/// client of `era`: the agent's listings leave `everything` out (the
/// operator's do not), and each use is refused and audited.
async fn direct_primitives_are_decided(setup: &Setup, era: Era) {
    let agent = setup.client(&setup.agent, era).await;
    let operator = setup.client(&setup.operator, era).await;

    // The token works where it should.
    let time = call(&agent, "time__get_current_time", json!({"timezone": "UTC"})).await;
    assert_ne!(time.is_error, Some(true), "{}", text(&time));

    // prompts/list shows each caller only what it may use.
    let names = |prompts: Vec<rmcp::model::Prompt>| -> Vec<String> {
        prompts.into_iter().map(|p| p.name).collect()
    };
    let seen = names(operator.peer().list_all_prompts().await.unwrap());
    assert!(
        seen.contains(&"everything__simple-prompt".into()),
        "{seen:?}"
    );
    let agent_sees = names(agent.peer().list_all_prompts().await.unwrap());
    assert!(agent_sees.is_empty(), "{era:?}: {agent_sees:?}");

    // prompts/get of an everything prompt.
    let got = agent
        .peer()
        .get_prompt(GetPromptRequestParams::new("everything__simple-prompt"))
        .await
        .unwrap_err();
    assert_eq!(refusal_of(got), "denied", "{era:?}");
    setup.assert_audited("prompts/get", "everything__simple-prompt", "denied");

    // resources/list and resources/templates/list.
    let uris: Vec<String> = operator
        .peer()
        .list_all_resources()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.uri.clone())
        .collect();
    assert!(uris.contains(&STATIC_URI.to_string()), "{uris:?}");
    let agent_uris = agent.peer().list_all_resources().await.unwrap();
    assert!(agent_uris.is_empty(), "{era:?}: {agent_uris:?}");
    let templates = operator.peer().list_all_resource_templates().await.unwrap();
    assert!(
        templates.iter().any(|t| t.uri_template == TEMPLATE),
        "{templates:?}"
    );
    let agent_templates = agent.peer().list_all_resource_templates().await.unwrap();
    assert!(agent_templates.is_empty(), "{era:?}: {agent_templates:?}");

    // resources/read of a listed resource and of a templated one.
    for uri in [STATIC_URI, TEMPLATED_URI] {
        let read = agent
            .peer()
            .read_resource(ReadResourceRequestParams::new(uri))
            .await
            .unwrap_err();
        assert_eq!(refusal_of(read), "denied", "{era:?} {uri}");
    }
    setup.assert_audited("resources/read", "everything__*", "denied");
    // completion/complete follows the prompt, or the template.
    let completed = agent
        .peer()
        .complete(prompt_completion("everything__completable-prompt"))
        .await
        .unwrap_err();
    assert_eq!(refusal_of(completed), "denied", "{era:?}");
    setup.assert_audited(
        "completion/complete",
        "everything__completable-prompt",
        "denied",
    );
    let completed = agent
        .peer()
        .complete(template_completion())
        .await
        .unwrap_err();
    assert_eq!(refusal_of(completed), "denied", "{era:?}");
    setup.assert_audited("completion/complete", "everything__*", "denied");

    agent.cancel().await.unwrap();
    operator.cancel().await.unwrap();
    setup.assert_everything_never_got(&["completion/complete"]);
}

#[tokio::test]
async fn direct_mode_legacy_sessions_get_no_prompt_resource_completion_or_log_level() {
    let setup = start("direct", true, true);
    direct_primitives_are_decided(&setup, Era::Legacy).await;

    let agent = setup.client(&setup.agent, Era::Legacy).await;
    // Subscriptions follow the resource.
    let subscribed = agent
        .peer()
        .subscribe(SubscribeRequestParams::new(STATIC_URI))
        .await
        .unwrap_err();
    assert_eq!(refusal_of(subscribed), "denied");
    setup.assert_audited("resources/subscribe", "everything__*", "denied");
    let unsubscribed = agent
        .peer()
        .unsubscribe(UnsubscribeRequestParams::new(STATIC_URI))
        .await
        .unwrap_err();
    assert_eq!(refusal_of(unsubscribed), "denied");
    setup.assert_audited("resources/unsubscribe", "everything__*", "denied");

    // logging/setLevel is the session's own: accepted, and no upstream's
    // level changes for everyone.
    agent
        .peer()
        .set_level(SetLevelRequestParams::new(LoggingLevel::Emergency))
        .await
        .unwrap();
    agent.cancel().await.unwrap();

    setup.assert_everything_never_got(&[
        "prompts/get",
        "resources/read",
        "completion/complete",
        "resources/subscribe",
        "resources/unsubscribe",
        "logging/setLevel",
    ]);
}

#[tokio::test]
async fn direct_mode_2026_clients_get_no_prompt_resource_completion_or_subscription() {
    let setup = start("direct", false, true);
    direct_primitives_are_decided(&setup, Era::Modern).await;

    // On 2026-07-28 a resource subscription is part of a listen stream: the
    // agent's is refused (rmcp acknowledges the stream first; the gateway
    // then drops the URI, so no update of it is ever sent).
    let agent = setup.client(&setup.agent, Era::Modern).await;
    let mut filter = SubscriptionFilter::new();
    filter.resources_list_changed = Some(true);
    filter.resource_subscriptions = Some(vec![STATIC_URI.to_string()]);
    let subscription = agent.peer().listen(filter).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while setup
        .refusals("resources/subscribe", "everything__*", "denied")
        .is_empty()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the listen stream's subscription was not refused"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    setup.assert_audited("resources/subscribe", "everything__*", "denied");
    drop(subscription);
    agent.cancel().await.unwrap();

    setup.assert_everything_never_got(&[
        "prompts/get",
        "resources/read",
        "completion/complete",
        "resources/subscribe",
    ]);
}

/// One raw JSON-RPC request to `/mcp` as `token` in `era` (stateless), or
/// over a legacy SSE session of its own, and its answer.
async fn raw(setup: &Setup, token: &str, era: Era, method: &str, params: Value) -> Value {
    let mut params = params;
    let version = match era {
        Era::LegacySse => return raw_sse(setup, token, method, params).await,
        Era::Legacy => "2025-11-25",
        Era::Modern => {
            params["_meta"] = json!({
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "one-door", "version": "1"},
            });
            "2026-07-28"
        }
    };
    // 2026-07-28 names the request in headers too (what it reads, plain ASCII here).
    let name = ["name", "uri", "taskId"]
        .iter()
        .find_map(|key| params[key].as_str())
        .unwrap_or_default()
        .to_string();
    let mut request = reqwest::Client::new()
        .post(&setup.gw.url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", version)
        .header("mcp-method", method);
    if !name.is_empty() {
        request = request.header("mcp-name", name);
    }
    let response = request
        .json(&json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}))
        .send()
        .await
        .unwrap();
    let body = response.text().await.unwrap();
    // A JSON body, or an event stream whose last message is the answer.
    let text = body
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .rfind(|l| l.contains("\"id\""))
        .map(str::to_string)
        .unwrap_or(body);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{method}: {e}: {text}"))
}

/// An `/sse` stream's events, read as they come.
struct SseEvents {
    response: reqwest::Response,
    pending: String,
}

impl SseEvents {
    /// The next event's data, within the deadline.
    async fn next_data(&mut self) -> String {
        let read = async {
            loop {
                if let Some(end) = self.pending.find("\n\n") {
                    let event: String = self.pending.drain(..end + 2).collect();
                    if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data:")) {
                        return data.trim().to_string();
                    }
                    continue;
                }
                let chunk = self
                    .response
                    .chunk()
                    .await
                    .unwrap()
                    .expect("the stream ended");
                self.pending.push_str(&String::from_utf8_lossy(&chunk));
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(30), read)
            .await
            .expect("an event within the deadline")
    }

    /// The reply to request `id`.
    async fn reply(&mut self, id: u64) -> Value {
        loop {
            let message: Value = serde_json::from_str(&self.next_data().await).unwrap();
            if message["id"] == id {
                return message;
            }
        }
    }
}

/// One request as `token` over a legacy SSE session of its own: `GET /sse`,
/// the handshake and the request POSTed to its endpoint, the answer read
/// from the stream.
async fn raw_sse(setup: &Setup, token: &str, method: &str, params: Value) -> Value {
    let http = reqwest::Client::new();
    let base = setup.base();
    let response = http
        .get(format!("{base}/sse"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{method}: GET /sse");
    let mut events = SseEvents {
        response,
        pending: String::new(),
    };
    let endpoint = format!("{base}{}", events.next_data().await);
    let post = |body: Value| {
        http.post(endpoint.as_str())
            .bearer_auth(token)
            .json(&body)
            .send()
    };
    if method != "initialize" {
        let initialize = json!({"protocolVersion": "2025-11-25", "capabilities": {},
                                "clientInfo": {"name": "one-door", "version": "1"}});
        post(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": initialize}))
            .await
            .unwrap();
        events.reply(0).await;
        post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await
            .unwrap();
    }
    let sent = post(json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}))
        .await
        .unwrap();
    assert_eq!(sent.status(), 202, "{method}: {:?}", sent.text().await);
    events.reply(7).await
}

/// What the gateway should do with a request kind from the agent.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Answered; nothing of `everything` in it.
    Answered,
    /// A JSON-RPC error whose data says `refusal`, audited as `tool`.
    Refused {
        refusal: &'static str,
        tool: &'static str,
    },
    /// A tool result that is a structured refusal, audited as `tool`.
    ToolRefused {
        refusal: &'static str,
        tool: &'static str,
    },
    /// Not served (in this era, or at all): method not found.
    NotFound,
    /// Served only to a client that declares an extension: -32021.
    MissingCapability,
}

#[tokio::test]
async fn every_request_kind_is_decided_in_both_eras_and_modes() {
    for mode in ["direct", "progressive"] {
        every_request_kind_is_decided(mode).await;
    }
}

/// Every kind, raw over HTTP, from the agent, in both eras, and in the
/// legacy era over legacy SSE sessions (`/sse`).
async fn every_request_kind_is_decided(mode: &str) {
    use Expect::*;
    let setup = start(mode, false, true);
    let direct = mode == "direct";
    let prompt = json!({"name": "everything__simple-prompt"});
    let uri = json!({ "uri": STATIC_URI });
    let completion = json!({"ref": {"type": "ref/prompt", "name": "everything__completable-prompt"},
                            "argument": {"name": "department", "value": "E"}});
    let call = json!({"name": "everything__echo", "arguments": {"message": "hi"}});
    let initialize = json!({"protocolVersion": "2025-11-25", "capabilities": {},
                            "clientInfo": {"name": "one-door", "version": "1"}});
    // Prompts, resources, completions and logging exist in direct mode only.
    let denied = |tool| {
        if direct {
            Refused {
                refusal: "denied",
                tool,
            }
        } else {
            NotFound
        }
    };
    let listing = if direct { Answered } else { NotFound };
    for era in [Era::Legacy, Era::Modern, Era::LegacySse] {
        let legacy = era != Era::Modern;
        // Every kind rmcp has (subscriptions/listen, a stream, is in the
        // 2026 client test above).
        let table: Vec<(&str, Value, Expect)> = vec![
            ("ping", json!({}), if legacy { Answered } else { NotFound }),
            ("initialize", initialize.clone(), Answered),
            ("server/discover", json!({}), Answered),
            ("tools/list", json!({}), Answered),
            (
                "tools/call",
                call.clone(),
                ToolRefused {
                    refusal: "denied",
                    tool: "everything__echo",
                },
            ),
            ("prompts/list", json!({}), listing),
            (
                "prompts/get",
                prompt.clone(),
                denied("everything__simple-prompt"),
            ),
            ("resources/list", json!({}), listing),
            ("resources/templates/list", json!({}), listing),
            ("resources/read", uri.clone(), denied("everything__*")),
            (
                "completion/complete",
                completion.clone(),
                denied("everything__completable-prompt"),
            ),
            (
                "resources/subscribe",
                uri.clone(),
                if legacy {
                    denied("everything__*")
                } else {
                    NotFound
                },
            ),
            (
                "resources/unsubscribe",
                uri.clone(),
                if legacy {
                    denied("everything__*")
                } else {
                    NotFound
                },
            ),
            (
                "logging/setLevel",
                json!({"level": "debug"}),
                if legacy && direct { Answered } else { NotFound },
            ),
            // Without the tasks extension declared (e2e/tasks.rs declares it).
            ("tasks/get", json!({"taskId": "t"}), MissingCapability),
            (
                "tasks/update",
                json!({"taskId": "t", "inputResponses": {}}),
                MissingCapability,
            ),
            ("tasks/cancel", json!({"taskId": "t"}), MissingCapability),
            ("tasks/list", json!({}), NotFound),
            ("tasks/result", json!({"taskId": "t"}), NotFound),
            ("skills/list", json!({}), NotFound),
            ("skills/get", json!({"uri": "skill://a/SKILL.md"}), NotFound),
            (
                "resources/directory/read",
                json!({"uri": "demo://"}),
                NotFound,
            ),
            ("x/anything", json!({}), NotFound),
        ];
        for (method, params, expect) in table {
            // Each era opens with its own handshake only.
            if (method == "server/discover" && legacy) || (method == "initialize" && !legacy) {
                continue;
            }
            let answer = raw(&setup, &setup.agent, era, method, params).await;
            let what = format!("{mode} {era:?} {method}: {answer}");
            match expect {
                Answered => {
                    assert!(answer["error"].is_null(), "{what}");
                    assert!(!answer.to_string().contains("everything__"), "{what}");
                    assert!(!answer.to_string().contains("demo://"), "{what}");
                }
                Refused { refusal, tool } => {
                    assert_eq!(answer["error"]["data"]["error"], refusal, "{what}");
                    setup.assert_audited(method, tool, refusal);
                }
                ToolRefused { refusal, tool } => {
                    assert_eq!(answer["result"]["isError"], true, "{what}");
                    assert_eq!(
                        answer["result"]["structuredContent"]["error"], refusal,
                        "{what}"
                    );
                    setup.assert_audited(method, tool, refusal);
                }
                NotFound => assert_eq!(answer["error"]["code"], -32601, "{what}"),
                MissingCapability => assert_eq!(answer["error"]["code"], -32021, "{what}"),
            }
        }
    }
    setup.assert_everything_never_got(&[
        "tools/call",
        "prompts/get",
        "resources/read",
        "completion/complete",
        "resources/subscribe",
        "logging/setLevel",
    ]);
}

#[tokio::test]
async fn http_routes_refuse_callers_without_the_right_token_scope_or_policy() {
    let setup = start("direct", false, true);
    let base = setup.base();
    let http = reqwest::Client::new();
    let path = setup.config();
    // A token that may call but not discover.
    let blind: Value = serde_json::from_str(&cli(
        &path,
        &[
            "token", "create", "--name", "blind", "--action", "call", "--json",
        ],
    ))
    .unwrap();
    let blind = blind["token"].as_str().unwrap();

    let export = http
        .get(format!("{base}/export?format=anthropic"))
        .bearer_auth(blind)
        .send()
        .await
        .unwrap();
    assert_eq!(export.status().as_u16(), 403);
    let body: Value = export.json().await.unwrap();
    assert_eq!(body["error"], "action_not_allowed", "{body}");

    let search = http
        .post(format!("{base}/search"))
        .bearer_auth(blind)
        .json(&json!({"query": "time", "format": "anthropic_tool_reference"}))
        .send()
        .await
        .unwrap();
    assert_eq!(search.status().as_u16(), 403);
    let body: Value = search.json().await.unwrap();
    assert_eq!(body["error"], "action_not_allowed", "{body}");

    // The agent's export and search leave out what it may not call.
    let export: Value = http
        .get(format!("{base}/export?format=anthropic"))
        .bearer_auth(&setup.agent)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(!export.to_string().contains("everything"), "{export}");
    assert!(export.to_string().contains("get_current_time"), "{export}");

    // A call outside the agent's policy: refused and audited.
    let called: Value = http
        .post(format!("{base}/call"))
        .bearer_auth(&setup.agent)
        .json(&json!({"name": "everything__echo", "arguments": {"message": "hi"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(called["result"]["isError"], true, "{called}");
    assert_eq!(
        called["result"]["structuredContent"]["error"], "denied",
        "{called}"
    );
    setup.assert_audited("tools/call", "everything__echo", "denied");

    // /admin needs the admin action.
    for token in [setup.agent.as_str(), blind] {
        let admin = http
            .get(format!("{base}/admin/servers"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(admin.status().as_u16(), 403);
    }
    let admin = http
        .get(format!("{base}/admin/servers"))
        .bearer_auth(&setup.operator)
        .send()
        .await
        .unwrap();
    assert_eq!(admin.status().as_u16(), 200);

    // A legacy SSE stream needs a valid token, and its session is its
    // opener's: a POST with no token or another's is refused.
    for token in [None, Some("mfd_forged")] {
        let mut open = http.get(format!("{base}/sse"));
        if let Some(token) = token {
            open = open.bearer_auth(token);
        }
        assert_eq!(open.send().await.unwrap().status().as_u16(), 401);
    }
    let stream = http
        .get(format!("{base}/sse"))
        .bearer_auth(&setup.agent)
        .send()
        .await
        .unwrap();
    let mut events = SseEvents {
        response: stream,
        pending: String::new(),
    };
    let endpoint = format!("{base}{}", events.next_data().await);
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    let anonymous = http.post(&endpoint).json(&ping).send().await.unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    for token in [setup.operator.as_str(), blind] {
        let other = http
            .post(&endpoint)
            .bearer_auth(token)
            .json(&ping)
            .send()
            .await
            .unwrap();
        assert_eq!(other.status().as_u16(), 403);
        let body: Value = other.json().await.unwrap();
        assert_eq!(body["error"], "session_of_another_caller", "{body}");
    }
    setup.assert_everything_never_got(&["tools/call"]);
}

/// `search_tools` names for `client` (none when the search found nothing).
async fn searched(client: &Client, query: &str) -> Vec<String> {
    let result = call(client, "search_tools", json!({"query": query})).await;
    serde_json::from_str::<Value>(&text(&result))
        .map(|found| found_names(&found))
        .unwrap_or_default()
}

#[tokio::test]
async fn progressive_server_switches_and_code_are_decided_in_both_eras() {
    let setup = start("progressive", false, false);
    for era in ERAS {
        let agent = setup.client(&setup.agent, era).await;
        let operator = setup.client(&setup.operator, era).await;
        assert!(
            searched(&agent, "current time")
                .await
                .contains(&"time__get_current_time".into())
        );

        // disable_server acts on the agent's own view only.
        let off = call(&agent, "disable_server", json!({"name": "time"})).await;
        assert_ne!(off.is_error, Some(true), "{era:?}: {}", text(&off));
        assert!(searched(&agent, "current time").await.is_empty(), "{era:?}");
        assert!(
            searched(&operator, "current time")
                .await
                .contains(&"time__get_current_time".into()),
            "{era:?}: the operator lost time"
        );
        let still = call(
            &operator,
            "call_tool",
            json!({"name": "time__get_current_time", "arguments": {"timezone": "UTC"}}),
        )
        .await;
        assert_ne!(still.is_error, Some(true), "{era:?}: {}", text(&still));
        // For everyone (and every replica) it stays on: nothing was switched.
        let server: Value = reqwest::Client::new()
            .get(format!("{}/admin/servers/time", setup.base()))
            .bearer_auth(&setup.operator)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(server["enabled"], true, "{server}");
        let on = call(&agent, "enable_server", json!({"name": "time"})).await;
        assert_ne!(on.is_error, Some(true), "{era:?}: {}", text(&on));
        assert!(
            searched(&agent, "current time")
                .await
                .contains(&"time__get_current_time".into())
        );

        // enable_server on a server the agent may not use: refused before
        // anything connects or starts.
        let refused = call(&agent, "enable_server", json!({"name": "everything"})).await;
        assert_eq!(refused.is_error, Some(true), "{era:?}: {}", text(&refused));
        assert_eq!(
            refused.structured_content.as_ref().unwrap()["error"],
            "denied",
            "{era:?}"
        );
        setup.assert_audited("enable_server", "everything__*", "denied");
        assert!(
            !setup.everything_started.exists(),
            "{era:?}: everything was started for a refused caller"
        );

        // execute_code needs the code action, which the agent lacks.
        let code = call(
            &agent,
            "execute_code",
            json!({"code": "return await time.get_current_time({timezone: 'UTC'});"}),
        )
        .await;
        assert_eq!(code.is_error, Some(true), "{era:?}: {}", text(&code));
        assert_eq!(
            code.structured_content.as_ref().unwrap()["error"],
            "action_not_allowed",
            "{era:?}"
        );
        setup.assert_audited("execute_code", "execute_code", "action_not_allowed");

        agent.cancel().await.unwrap();
        operator.cancel().await.unwrap();
    }

    // The operator may switch everything on in its own view: that starts it.
    let operator = setup.client(&setup.operator, Era::Legacy).await;
    let on = call(&operator, "enable_server", json!({"name": "everything"})).await;
    assert_ne!(on.is_error, Some(true), "{}", text(&on));
    assert!(setup.everything_started.exists());
    // The agent's list of servers leaves out the one it may not use.
    let agent = setup.client(&setup.agent, Era::Legacy).await;
    let servers = json(&call(&agent, "search_available_servers", json!({})).await);
    let names: Vec<&str> = servers["servers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["time"], "{servers}");
    assert!(
        searched(&agent, "echo")
            .await
            .iter()
            .all(|n| !n.starts_with("everything__"))
    );
    operator.cancel().await.unwrap();
    agent.cancel().await.unwrap();
}
