//! OpenTelemetry traces end to end: a real `manifold serve` exports OTLP/HTTP
//! (protobuf) to a receiver this test runs, a real MCP client calls a tool
//! on a Streamable HTTP upstream (a real `manifold-fixture --http`), and the
//! upstream receives the W3C `traceparent` of the gateway's upstream span.

use crate::common;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{Router, body::Bytes, extract::State, routing::post};
use common::*;
use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest, common::v1::any_value,
};
use prost::Message;
use serde_json::json;

#[derive(Debug, Clone)]
struct ReceivedSpan {
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    /// Every attribute as `key=value`.
    attributes: Vec<String>,
    service: String,
}

type Spans = Arc<Mutex<Vec<ReceivedSpan>>>;

/// An OTLP/HTTP receiver: `POST /v1/traces` with a protobuf
/// `ExportTraceServiceRequest`, decoded and kept.
async fn start_receiver() -> (String, Spans) {
    async fn receive(State(spans): State<Spans>, body: Bytes) -> &'static str {
        let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
        let mut spans = spans.lock().unwrap();
        for resource in request.resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.as_ref())
                .map(|v| format!("{:?}", v.value))
                .unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    spans.push(ReceivedSpan {
                        name: span.name.clone(),
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        attributes: span
                            .attributes
                            .iter()
                            .map(|a| {
                                let value = match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                                    Some(any_value::Value::StringValue(s)) => s.clone(),
                                    other => format!("{other:?}"),
                                };
                                format!("{}={value}", a.key)
                            })
                            .collect(),
                        service: service.clone(),
                    });
                }
            }
        }
        ""
    }
    let spans: Spans = Arc::default();
    let app = Router::new()
        .route("/v1/traces", post(receive))
        .with_state(Arc::clone(&spans));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, spans)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const ARGUMENT_MARKER: &str = "argument-marker-77c1";
const SECRET_MARKER: &str = "secret-marker-3f9e";

#[tokio::test]
async fn traces_reach_an_otlp_receiver_and_the_trace_context_reaches_http_upstreams() {
    let dir = tempfile::tempdir().unwrap();
    let schema = json!({"type": "object", "properties": {
        "text": {"type": "string"}, "password": {"type": "string"}}});
    let tools = write_catalog(
        dir.path(),
        "tools.jsonl",
        &[("web", "echo", "Echo a text back.", schema)],
    );
    let count_file = dir.path().join("web.requests");
    let upstream = HttpFixture::start(&tools, "web", &count_file);
    let (receiver, spans) = start_receiver().await;

    let gw = GatewayProcess::start_with_env(
        &format!(
            "[gateway]\nmode = \"direct\"\n\n[telemetry]\notlp_endpoint = {receiver:?}\n\
             service_name = \"manifold-under-test\"\n\n[search.embedding]\nenabled = false\n\n\
             [[servers]]\nname = \"web\"\nurl = {:?}\n",
            upstream.url
        ),
        // Export every 100 ms instead of every 5 s.
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    let client = connect(&gw.url, None).await;
    let result = call(
        &client,
        "web__echo",
        json!({"text": ARGUMENT_MARKER, "password": SECRET_MARKER}),
    )
    .await;
    assert_ne!(result.is_error, Some(true), "{}", text(&result));
    client.cancel().await.unwrap();

    // The call's span and its upstream request's span, in one trace.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (call_span, upstream_span) = loop {
        let found = {
            let spans = spans.lock().unwrap();
            let call = spans
                .iter()
                .find(|s| s.name == "broker.call" && s.attributes.contains(&"tool=echo".into()))
                .cloned();
            let upstream = spans
                .iter()
                .find(|s| {
                    s.name == "upstream.request"
                        && s.attributes.contains(&"operation=tools/call".into())
                })
                .cloned();
            call.zip(upstream)
        };
        if let Some(found) = found {
            break found;
        }
        assert!(
            Instant::now() < deadline,
            "spans did not arrive: {:?}",
            spans.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(upstream_span.trace_id, call_span.trace_id);
    assert_eq!(upstream_span.parent_span_id, call_span.span_id);
    assert!(upstream_span.attributes.contains(&"server=web".into()));
    assert!(
        call_span.service.contains("manifold-under-test"),
        "{}",
        call_span.service
    );

    // The upstream got the upstream span's context as a W3C header.
    let requests = std::fs::read_to_string(&count_file).unwrap();
    let traceparent = requests
        .lines()
        .find_map(|l| l.strip_prefix("traceparent "))
        .unwrap_or_else(|| panic!("no traceparent reached the upstream: {requests}"));
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[0], "00");
    assert_eq!(parts[1], upstream_span.trace_id, "{traceparent}");
    assert_eq!(parts[2], upstream_span.span_id, "{traceparent}");

    // A caller's own trace context (the HTTP header) becomes the parent of
    // the gateway's call span, and its trace id goes on upstream.
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let response = reqwest::Client::new()
        .post(&gw.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .header("traceparent", format!("00-{caller_trace}-{caller_span}-01"))
        .json(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                      "params": {"name": "web__echo", "arguments": {"text": "again"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let deadline = Instant::now() + Duration::from_secs(30);
    let joined = loop {
        let found = spans
            .lock()
            .unwrap()
            .iter()
            .find(|s| s.name == "broker.call" && s.trace_id == caller_trace)
            .cloned();
        if let Some(found) = found {
            break found;
        }
        assert!(
            Instant::now() < deadline,
            "the caller's trace was not joined"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(joined.parent_span_id, caller_span);
    let requests = std::fs::read_to_string(&count_file).unwrap();
    assert!(
        requests
            .lines()
            .any(|l| l.starts_with(&format!("traceparent 00-{caller_trace}-"))),
        "{requests}"
    );

    // No span carries an argument or a secret.
    for span in spans.lock().unwrap().iter() {
        for attribute in &span.attributes {
            assert!(
                !attribute.contains(ARGUMENT_MARKER) && !attribute.contains(SECRET_MARKER),
                "{} carries {attribute}",
                span.name
            );
        }
    }
}
