//! The code-mode sandbox from the binary's side: the worker entry point and
//! starting the pool with the gateway.

use std::{
    fs::File,
    io::Write,
    os::fd::{FromRawFd, OwnedFd},
    sync::Arc,
};

use anyhow::Context;
use manifold_codemode::{
    isolation::{self, IsolationConfig},
    pool::{Sandbox, SandboxConfig},
    worker,
};
use manifold_config::{CodeModeSection, SandboxSetting};
use serde_json::{Value, json};

use crate::{SANDBOX_WORKER, settings};

/// `manifold sandbox-worker [isolation-json]`: isolate, report, serve runs
/// on stdin/stdout. Returns the exit code.
pub fn worker_main(isolation_json: Option<String>) -> i32 {
    let config: IsolationConfig = isolation_json
        .and_then(|json| serde_json::from_str(&json).ok())
        .unwrap_or_default();
    let report = isolation::isolate(&config);
    let probes = isolation::probe();
    let ready = json!({ "mode": "process", "layers": report.layers, "probes": probes });
    // SAFETY: fd 0 is this process's stdin, owned by nothing else here.
    let stdin = File::from(unsafe { OwnedFd::from_raw_fd(0) });
    let stdout = std::io::stdout().lock();
    match worker::serve(stdin, stdout, ready) {
        Ok(()) => 0,
        Err(error) => {
            let _ = writeln!(std::io::stderr(), "sandbox worker: {error}");
            1
        }
    }
}

pub fn sandbox_config(section: &CodeModeSection) -> anyhow::Result<SandboxConfig> {
    let program = std::env::current_exe().context("cannot find the manifold binary")?;
    Ok(SandboxConfig {
        mode: settings::sandbox_mode(section.sandbox),
        workers: section.workers.max(1),
        program,
        args: vec![
            SANDBOX_WORKER.to_string(),
            serde_json::to_string(&settings::isolation(section))?,
        ],
        limits: settings::run_limits(section),
        admission: settings::run_admission(section),
    })
}

/// Starts the pool and says, loudly, what isolation it lacks. The second
/// value is why no script may run: with `require_isolation` (the default),
/// a missing layer makes code mode fail closed, every `execute_code`
/// answering that reason, while the rest of the gateway serves.
pub async fn start(section: &CodeModeSection) -> anyhow::Result<(Arc<Sandbox>, Option<String>)> {
    let sandbox = Sandbox::start(sandbox_config(section)?)
        .await
        .context("cannot start the code-mode sandbox")?;
    let report = sandbox.isolation();
    if section.sandbox == SandboxSetting::InProcess {
        tracing::warn!(
            "code mode runs scripts IN PROCESS (code_mode.sandbox = \"in_process\"): no process isolation; the broker still governs every call"
        );
        return Ok((sandbox, None));
    }
    let missing = inactive_layers(&report);
    if missing.is_empty() {
        tracing::info!(
            workers = section.workers,
            "code-mode sandbox ready, every isolation layer active"
        );
        return Ok((sandbox, None));
    }
    for (name, detail) in &missing {
        tracing::warn!(layer = %name, %detail, "CODE-MODE ISOLATION LAYER INACTIVE");
    }
    if !section.require_isolation {
        tracing::warn!("code_mode.require_isolation = false: scripts run without those layers");
        return Ok((sandbox, None));
    }
    let refusal = format!(
        "code mode is off because {} sandbox isolation layer(s) are inactive on this host: {}. \
         The operator can fix the host (see `manifold doctor`) or opt out with \
         code_mode.require_isolation = false",
        missing.len(),
        missing
            .iter()
            .map(|(n, d)| format!("{n} ({d})"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    tracing::error!("{refusal}");
    Ok((sandbox, Some(refusal)))
}

pub fn inactive_layers(report: &Value) -> Vec<(String, String)> {
    report["layers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|layer| layer["active"] != json!(true))
        .map(|layer| {
            (
                layer["name"].as_str().unwrap_or("?").to_string(),
                layer["detail"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}
