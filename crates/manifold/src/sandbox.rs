//! The code-mode sandbox from the binary's side: the worker entry point,
//! starting the pool with the gateway, and `manifold doctor`.

use std::{
    fs::File,
    io::Write,
    os::fd::{FromRawFd, OwnedFd},
    path::Path,
    sync::Arc,
};

use anyhow::{Context, bail};
use manifold_codemode::{
    isolation::{self, IsolationConfig},
    pool::{Sandbox, SandboxConfig, SandboxMode},
    worker,
};
use serde_json::{Value, json};

use crate::{SANDBOX_WORKER, config::CodeModeSection};

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
        mode: section.sandbox,
        workers: section.workers.max(1),
        program,
        args: vec![
            SANDBOX_WORKER.to_string(),
            serde_json::to_string(&section.isolation())?,
        ],
        limits: section.limits(),
        admission: section.admission(),
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
    if section.sandbox == SandboxMode::InProcess {
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

fn inactive_layers(report: &Value) -> Vec<(String, String)> {
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

/// `manifold doctor`: starts one worker with the configured isolation and
/// prints its layers and probes. Exits non-zero when a layer is inactive.
pub async fn doctor(config: &Option<std::path::PathBuf>, as_json: bool) -> anyhow::Result<()> {
    let loaded = match config {
        Some(path) => crate::config::Config::load(Path::new(path))?,
        None => toml::from_str("").context("the default config")?,
    };
    let warnings = loaded.security_warnings();
    let search = crate::gateway::search_in_force(&loaded).await;
    let section = loaded.code_mode;
    let mut sandbox_config = sandbox_config(&section)?;
    sandbox_config.workers = 1;
    sandbox_config.mode = SandboxMode::Process;
    let sandbox = Sandbox::start(sandbox_config)
        .await
        .context("cannot start a sandbox worker")?;
    let report = sandbox.isolation();
    let missing = inactive_layers(&report);
    if as_json {
        let mut report = report.clone();
        report["search"] = search.clone();
        report["security"] = warnings
            .iter()
            .map(|(setting, why)| json!({ "setting": setting, "weakened": why }))
            .collect();
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "search: strategy in force {} (configured {}); model {}",
            search["in_force"].as_str().unwrap_or("?"),
            search["configured"].as_str().unwrap_or("?"),
            search["model"]
                .as_str()
                .map(|id| format!(
                    "{} loaded, id {id}",
                    search["described"].as_str().unwrap_or("")
                ))
                .unwrap_or_else(|| "none loaded (see the log line above for why)".into()),
        );
        if warnings.is_empty() {
            println!("security settings: none off or weakened");
        } else {
            println!("security settings that are off or weakened");
            for (setting, why) in &warnings {
                println!("  WEAKENED  {setting}: {why}");
            }
        }
        println!("code-mode sandbox isolation");
        print_rows(&report["layers"], "active", ["active  ", "INACTIVE"]);
        println!("probes (from inside the worker)");
        print_rows(&report["probes"], "blocked", ["blocked ", "ALLOWED "]);
    }
    if !missing.is_empty() {
        bail!("{} isolation layer(s) inactive", missing.len());
    }
    Ok(())
}

/// One line per layer or probe: its mark (`marks[0]` when `flag` is true),
/// name and detail.
fn print_rows(rows: &Value, flag: &str, marks: [&str; 2]) {
    for row in rows.as_array().into_iter().flatten() {
        let mark = if row[flag] == json!(true) {
            marks[0]
        } else {
            marks[1]
        };
        println!(
            "  {mark}  {:<18} {}",
            row["name"].as_str().unwrap_or("?"),
            row["detail"].as_str().unwrap_or("")
        );
    }
}
