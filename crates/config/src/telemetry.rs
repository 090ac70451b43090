//! What the gateway tells its operators: `[log]` and `[telemetry]`. Both
//! are read before the rest of the config (logging starts first).

use serde::Deserialize;

/// How the gateway logs.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// `text` (default) or `json`; `--log-format` overrides it.
    #[serde(default)]
    pub format: LogFormat,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// `[telemetry]`: where traces go.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySection {
    /// An OTLP/HTTP collector, e.g. `http://127.0.0.1:4318` (`/v1/traces`
    /// is appended unless the path already names it). Without it,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`;
    /// without any of them, no traces.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` resource attribute (default `manifold`; the
    /// `OTEL_SERVICE_NAME` variable wins).
    pub service_name: Option<String>,
}

impl TelemetrySection {
    /// Whether traces are exported, and where to (`None`: as the OTLP
    /// environment variables say).
    pub fn endpoint(&self) -> Option<Option<String>> {
        if let Some(endpoint) = self.otlp_endpoint.as_deref().filter(|e| !e.is_empty()) {
            let endpoint = endpoint.trim_end_matches('/');
            return Some(Some(if endpoint.ends_with("/v1/traces") {
                endpoint.to_string()
            } else {
                format!("{endpoint}/v1/traces")
            }));
        }
        let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.is_empty());
        (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
            .then_some(None)
    }
}
