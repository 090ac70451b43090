//! The processes a benchmark drives: fixture upstreams and gateways, found
//! beside this binary (`cargo build --workspace --bins` builds them all into
//! one folder).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, bail};
use serde_json::json;
use tokio::io::AsyncBufReadExt;

/// The workspace binary `name`, from the folder this one is in.
pub fn beside(name: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::current_exe()?.with_file_name(name);
    if !path.is_file() {
        bail!(
            "{} is missing: build it with `cargo build --workspace --bins` (the same profile as this binary)",
            path.display()
        );
    }
    Ok(path)
}

/// Start a fixture upstream over Streamable HTTP; returns the child and its URL.
pub async fn start_http_fixture(dir: &Path) -> anyhow::Result<(tokio::process::Child, String)> {
    start_http_fixture_with(dir, &[]).await
}

/// [`start_http_fixture`] with extra `catalog` flags (delays, cache scope).
pub async fn start_http_fixture_with(
    dir: &Path,
    flags: &[&str],
) -> anyhow::Result<(tokio::process::Child, String)> {
    let catalog = dir.join("bench.jsonl");
    std::fs::write(
        &catalog,
        json!({
            "id": "bench::echo", "server": "bench", "name": "echo",
            "description": "Echo the message back.",
            "input_schema": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}
        })
        .to_string()
            + "\n",
    )?;
    let exe = beside("manifold-fixture")?;
    let mut child = tokio::process::Command::new(&exe)
        .args(["--http", "127.0.0.1:0", "catalog", "--file"])
        .arg(&catalog)
        .args(["--server", "bench"])
        .args(flags)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", exe.display()))?;
    let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("piped")).lines();
    let url = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(i) = line.find("listening on ") {
                return Ok::<_, anyhow::Error>(
                    line[i + "listening on ".len()..].trim().to_string(),
                );
            }
        }
        bail!("fixture exited before listening")
    })
    .await
    .context("fixture did not start")??;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, url))
}

/// `manifold serve` on `config` at a free loopback port, with `MANIFOLD_LOG`
/// set to `log`: the child (killed on drop), its URL and its pid.
pub async fn start_gateway(
    config: &Path,
    log: &str,
) -> anyhow::Result<(tokio::process::Child, String, u32)> {
    let mut child = tokio::process::Command::new(beside("manifold")?)
        .args(["serve", "--config"])
        .arg(config)
        .args(["--listen", "127.0.0.1:0"])
        .env("MANIFOLD_LOG", log)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start manifold serve")?;
    let pid = child.id().context("gateway pid")?;
    let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("piped")).lines();
    let url = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(i) = line.find("manifold listening on ") {
                return Ok::<_, anyhow::Error>(
                    line[i + "manifold listening on ".len()..]
                        .trim()
                        .to_string(),
                );
            }
        }
        bail!("the gateway exited before listening")
    })
    .await
    .context("the gateway did not start in 60 s")??;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, url, pid))
}

/// The resident set of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
