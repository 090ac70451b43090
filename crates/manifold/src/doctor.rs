//! `manifold doctor`: what a config's gateway would run with, checked on
//! this host: the search strategy in force, the settings that weaken
//! security, and the sandbox's isolation layers as a worker reports them.

use std::path::PathBuf;

use anyhow::{Context, bail};
use manifold_codemode::pool::{Sandbox, SandboxMode};
use manifold_config::Config;
use serde_json::{Value, json};

use crate::{gateway, sandbox};

/// `manifold doctor`: starts one worker with the configured isolation and
/// prints its layers and probes. Exits non-zero when a layer is inactive.
pub async fn run(config: &Option<PathBuf>, as_json: bool) -> anyhow::Result<()> {
    let loaded = match config {
        Some(path) => Config::load(path)?,
        None => toml::from_str("").context("the default config")?,
    };
    let warnings = loaded.security_warnings();
    let search = gateway::search_in_force(&loaded).await;
    let section = loaded.code_mode;
    let mut sandbox_config = sandbox::sandbox_config(&section)?;
    sandbox_config.workers = 1;
    sandbox_config.mode = SandboxMode::Process;
    let worker = Sandbox::start(sandbox_config)
        .await
        .context("cannot start a sandbox worker")?;
    let report = worker.isolation();
    let missing = sandbox::inactive_layers(&report);
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
