//! What the gateway tells its operators: logs on stderr (text or JSON
//! lines) and Prometheus metrics at `/metrics`.

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use axum::{Router, extract::State, routing::get};
use manifold_config::{LogFormat, TelemetrySection};
use manifold_server::GatewayState;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// The trace exporter, to flush before the process exits.
pub struct Traces(opentelemetry_sdk::trace::SdkTracerProvider);

impl Traces {
    /// Exports the spans still buffered. Blocking: the exporter runs on its
    /// own thread.
    pub fn shutdown(self) {
        if let Err(error) = self.0.shutdown() {
            tracing::warn!(%error, "trace exporter did not shut down cleanly");
        }
    }
}

/// Logs go to stderr: stdout belongs to the MCP stream in stdio mode.
/// `MANIFOLD_LOG` sets the filter. Nothing logs tool arguments or
/// credentials, and rmcp (which could log whole messages at debug level)
/// stays at warn unless the filter names it. With an OTLP endpoint, the same
/// spans (those the filter lets through) are exported as traces.
pub fn init_logging(format: LogFormat, telemetry: &TelemetrySection) -> Option<Traces> {
    use tracing_subscriber::{Layer, layer::SubscriberExt, util::SubscriberInitExt};
    let filter = tracing_subscriber::EnvFilter::try_from_env("MANIFOLD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt.json().flatten_event(true).boxed(),
    };
    let (traces, otel) = match telemetry.endpoint().map(|e| tracer_provider(e, telemetry)) {
        Some(Ok(provider)) => {
            use opentelemetry::trace::TracerProvider;
            let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("manifold"));
            (Some(Traces(provider)), Some(layer))
        }
        Some(Err(error)) => {
            // Logging is not up yet; say it once it is.
            eprintln!("manifold: traces are off: {error:#}");
            (None, None)
        }
        None => (None, None),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .init();
    traces
}

/// An OTLP/HTTP (protobuf) exporter behind a batch processor, which
/// exports from its own thread.
fn tracer_provider(
    endpoint: Option<String>,
    telemetry: &TelemetrySection,
) -> anyhow::Result<opentelemetry_sdk::trace::SdkTracerProvider> {
    // Headers, if the collector needs any, come from OTEL_EXPORTER_OTLP_HEADERS.
    use opentelemetry_otlp::WithExportConfig;
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_timeout(Duration::from_secs(5));
    if let Some(endpoint) = endpoint {
        exporter = exporter.with_endpoint(endpoint);
    }
    let exporter = exporter.build().context("OTLP exporter")?;
    let name = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| telemetry.service_name.clone())
        .unwrap_or_else(|| "manifold".to_string());
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(name)
        .build();
    Ok(opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// Histogram buckets for every `*_seconds` series: 1 ms to a minute.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

const COUNTERS: &[(&str, &str)] = &[
    (
        "manifold_requests_total",
        "JSON-RPC requests to /mcp, by method and HTTP status class",
    ),
    (
        "manifold_tool_calls_total",
        "Tool calls through the broker, by server, tool and outcome (ok, tool_error, upstream_error, cancelled, a refusal code, invalid_arguments, unknown_tool)",
    ),
    (
        "manifold_upstream_restarts_total",
        "Restart attempts after an upstream connection was lost, by server",
    ),
    (
        "manifold_cache_requests_total",
        "Cache lookups by cache (catalog, search_index, code_bindings, validators) and result (hit, miss)",
    ),
    (
        "manifold_discovery_refusals_total",
        "Discovery requests refused with 503 tool_discovery_busy",
    ),
    (
        "manifold_code_runs_total",
        "execute_code runs by ending (completed, threw, cpu_deadline, wall_deadline, memory_limit, worker_lost, unresponsive, syntax_error, unavailable, refused)",
    ),
    (
        "manifold_config_reloads_total",
        "Config reloads by result (applied, rejected)",
    ),
];

const GAUGES: &[(&str, &str)] = &[
    (
        "manifold_requests_in_flight",
        "JSON-RPC requests to /mcp being answered",
    ),
    (
        "manifold_upstream_up",
        "1 while the server's connection is up, else 0, by server",
    ),
    (
        "manifold_discovery_queue_depth",
        "Discovery requests waiting for a slot",
    ),
    ("manifold_discovery_active", "Discovery requests running"),
    (
        "manifold_approvals_pending",
        "Approval requests pending in the store (read at scrape time)",
    ),
];

const HISTOGRAMS: &[(&str, &str)] = &[
    (
        "manifold_request_duration_seconds",
        "Time from a request's arrival to the end of its response, by method",
    ),
    (
        "manifold_tool_call_duration_seconds",
        "Time an authorized call spent upstream, by server and tool",
    ),
    (
        "manifold_code_run_duration_seconds",
        "Wall time of execute_code runs",
    ),
];

/// Installs the process-wide recorder and describes every series. Series
/// without labels start at zero so a scrape shows them before any traffic.
pub fn install_metrics() -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
        .context("invalid histogram buckets")?
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    for (name, help) in COUNTERS {
        metrics::describe_counter!(*name, *help);
    }
    for (name, help) in GAUGES {
        metrics::describe_gauge!(*name, *help);
    }
    for (name, help) in HISTOGRAMS {
        metrics::describe_histogram!(*name, metrics::Unit::Seconds, *help);
    }
    for name in [
        "manifold_requests_in_flight",
        "manifold_discovery_queue_depth",
        "manifold_discovery_active",
        "manifold_approvals_pending",
    ] {
        metrics::gauge!(name).set(0.0);
    }
    metrics::counter!("manifold_discovery_refusals_total").absolute(0);
    // Histograms are buffered until upkeep drains them.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(Duration::from_secs(5));
        loop {
            ticks.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

struct MetricsState {
    handle: PrometheusHandle,
    gateway: Arc<GatewayState>,
}

/// Prometheus text at `/metrics`, unauthenticated like the health routes.
pub fn metrics_route(handle: PrometheusHandle, gateway: Arc<GatewayState>) -> Router {
    Router::new()
        .route("/metrics", get(render))
        .with_state(Arc::new(MetricsState { handle, gateway }))
}

async fn render(State(state): State<Arc<MetricsState>>) -> String {
    refresh_pending_approvals(&state.gateway).await;
    state.handle.render()
}

/// Approvals live in the store, shared by every replica: the gauge is read
/// there, not counted here.
async fn refresh_pending_approvals(gateway: &GatewayState) {
    match gateway.governance().store().count_pending().await {
        Ok(pending) => metrics::gauge!("manifold_approvals_pending").set(pending as f64),
        Err(error) => tracing::warn!(%error, "cannot count pending approvals for /metrics"),
    }
}
