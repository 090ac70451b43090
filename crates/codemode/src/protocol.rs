//! What the gateway and a sandbox worker say to each other: one JSON object
//! per line, each way.

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::engine::{Binding, EngineLimits, Reply, RunReport, Stream};

/// Gateway to worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ToWorker {
    /// Run one script (JavaScript, types already stripped).
    Run {
        code: String,
        bindings: Vec<Binding>,
        limits: EngineLimits,
    },
    /// The answer to a `call`.
    Reply(Reply),
}

/// Worker to gateway.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum FromWorker {
    /// Sent once, before the first run: what isolation the worker applied
    /// and what its own probes found.
    Ready {
        isolation: Json,
    },
    Call {
        id: u64,
        tool: String,
        args: Json,
    },
    Log {
        stream: Stream,
        text: String,
    },
    Done {
        report: RunReport,
    },
}
