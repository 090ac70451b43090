//! Shared test harness: real `manifold` and `manifold-fixture` processes on
//! loopback, driven by a real MCP client (rmcp).
#![allow(dead_code)]

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use rmcp::{
    RoleClient, ServiceExt,
    model::{CallToolRequestParams, CallToolResult},
    service::RunningService,
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde_json::Value;

pub fn manifold_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_manifold"))
}

/// The fixture server binary, built beside `manifold` by `cargo build --workspace`.
pub fn fixture_bin() -> PathBuf {
    let path = manifold_bin().with_file_name("manifold-fixture");
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace --bins` first",
        path.display()
    );
    path
}

/// The benchmark binary, built beside `manifold` by `cargo build --workspace --bins`.
pub fn bench_bin() -> PathBuf {
    let path = manifold_bin().with_file_name("manifold-bench");
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace --bins` first",
        path.display()
    );
    path
}

/// A small catalog: `servers` servers with the given tools each.
pub fn write_catalog(dir: &Path, file: &str, rows: &[(&str, &str, &str, Value)]) -> PathBuf {
    let path = dir.join(file);
    let mut text = String::new();
    for (server, name, description, schema) in rows {
        let row = serde_json::json!({
            "id": format!("{server}::{name}"),
            "server": server,
            "server_description": format!("The {server} server"),
            "name": name,
            "description": description,
            "input_schema": schema,
        });
        text.push_str(&row.to_string());
        text.push('\n');
    }
    std::fs::write(&path, text).unwrap();
    path
}

/// A `[[servers]]` entry that serves `server` from `catalog` with extra fixture flags.
pub fn fixture_server(name: &str, catalog: &Path, flags: &[&str], extra_toml: &str) -> String {
    let mut args = vec![
        "catalog".to_string(),
        "--file".to_string(),
        catalog.display().to_string(),
        "--server".to_string(),
        name.to_string(),
    ];
    args.extend(flags.iter().map(|s| s.to_string()));
    format!(
        "[[servers]]\nname = {name:?}\ndescription = \"The {name} server\"\ncommand = {:?}\nargs = {}\n{extra_toml}\n",
        fixture_bin().display().to_string(),
        serde_json::to_string(&args).unwrap()
    )
}

/// A running `manifold serve`, killed on drop.
pub struct GatewayProcess {
    pub child: Child,
    pub url: String,
    pub dir: tempfile::TempDir,
    pub stderr: mpsc::Receiver<String>,
    /// What the gateway logged before it listened (ANSI colours removed).
    pub startup: Vec<String>,
}

impl GatewayProcess {
    pub fn start(config: &str) -> Self {
        Self::start_with_env(config, &[])
    }

    /// Like [`GatewayProcess::start`], with extra environment variables
    /// (which win over the defaults, `MANIFOLD_LOG` included).
    pub fn start_with_env(config: &str, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manifold.toml");
        std::fs::write(&path, config).unwrap();
        Self::serve(dir, &path, env)
    }

    /// A gateway on a config file the test keeps (`dir` only lives as long).
    pub fn start_file(path: &Path, env: &[(&str, &str)]) -> Self {
        Self::serve(tempfile::tempdir().unwrap(), path, env)
    }

    fn serve(dir: tempfile::TempDir, path: &Path, env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(manifold_bin())
            .args(["serve", "--config"])
            .arg(path)
            .args(["--listen", "127.0.0.1:0"])
            .env(
                "MANIFOLD_LOG",
                std::env::var("TEST_MANIFOLD_LOG").unwrap_or_else(|_| "info,rmcp=warn".into()),
            )
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn manifold");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[manifold] {line}");
                if tx.send(line).is_err() {
                    // Keep draining so the gateway never blocks on a full pipe.
                }
            }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut startup = Vec::new();
        let url = loop {
            let remaining = deadline.saturating_duration_since(std::time::Instant::now());
            let line = rx
                .recv_timeout(remaining)
                .expect("gateway did not start in 60 s");
            if let Some(rest) = line.strip_prefix("manifold listening on ") {
                break rest.trim().to_string();
            }
            startup.push(strip_ansi(&line));
        };
        Self {
            child,
            url,
            dir,
            stderr: rx,
            startup,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// `line` without ANSI escape sequences (`ESC [ ... letter`).
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub type Client = RunningService<RoleClient, ()>;

/// A real MCP client over Streamable HTTP, optionally with a bearer token.
pub async fn connect(url: &str, token: Option<&str>) -> Client {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_string());
    if let Some(token) = token {
        config = config.auth_header(token.to_string());
    }
    let transport = StreamableHttpClientTransport::from_config(config);
    ().serve(transport).await.expect("client connects")
}

pub async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    let mut params = CallToolRequestParams::new(tool.to_string());
    params.arguments = args.as_object().cloned();
    client
        .peer()
        .call_tool(params)
        .await
        .expect("call succeeds at the protocol level")
}

/// The first text block of a result.
pub fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .find_map(|c| c.as_text().map(|t| t.text.clone()))
        .unwrap_or_default()
}

/// The first text block parsed as JSON.
pub fn json(result: &CallToolResult) -> Value {
    serde_json::from_str(&text(result))
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(result)))
}

/// Lines of a fixture's `--count-file` that start with `prefix`.
pub fn count_requests(path: &Path, prefix: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(prefix))
        .count()
}

/// Tool names found by `search_tools`.
pub fn found_names(search: &Value) -> Vec<String> {
    search["servers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["tools"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["name"].as_str().map(str::to_string))
        .collect()
}

/// Runs `manifold ARGS --config CONFIG` to completion; panics with its stderr
/// unless it succeeds, and returns its stdout.
/// An operator's approval of every tool of `server` that is waiting in
/// quarantine: lists through `client` (which records the tools), then
/// `manifold tools approve` for each. An `untrusted` server's tools wait
/// there until an operator has looked at them.
pub async fn approve_quarantined(client: &Client, config: &Path, server: &str) {
    let _ = call(client, "search_tools", serde_json::json!({"query": server})).await;
    let listed = cli(config, &["tools", "list", "--quarantined", "--json"]);
    let tools: Value = serde_json::from_str(&listed).unwrap();
    let mut approved = 0;
    for tool in tools.as_array().into_iter().flatten() {
        if tool["server"] == server {
            cli(
                config,
                &["tools", "approve", server, tool["tool"].as_str().unwrap()],
            );
            approved += 1;
        }
    }
    assert!(approved > 0, "nothing of {server} was waiting: {listed}");
    // The CLI is another process: the gateway hears its change within the
    // governance window (20 ms plus one read on SQLite); wait well past it.
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// The value of the line of `text` that starts with `key` (a CLI's
/// `id: …` or `token: …` line).
pub fn line_value<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.trim_start().strip_prefix(key))
        .unwrap_or_else(|| panic!("no '{key}' line in:\n{text}"))
        .trim()
}

pub fn cli(config: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(manifold_bin())
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "manifold {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `manifold <args>` (an audit read) until `found` accepts its output, for
/// up to ten seconds, and that output (the last one at the deadline). A row
/// is visible to another process once its reply has gone; the deadline
/// covers rows written after a reply (a refused bearer's, an abandoned
/// call's) without a test racing them.
pub fn cli_until(config: &Path, args: &[&str], found: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let out = cli(config, args);
        if found(&out) || std::time::Instant::now() >= deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `manifold-fixture` serving Streamable HTTP; killed on drop.
pub struct HttpFixture {
    child: std::process::Child,
    pub url: String,
}

impl HttpFixture {
    pub fn start(catalog: &std::path::Path, server: &str, count_file: &std::path::Path) -> Self {
        let mut command = std::process::Command::new(fixture_bin());
        command
            .arg("catalog")
            .arg("--file")
            .arg(catalog)
            .args(["--server", server, "--http", "127.0.0.1:0", "--count-file"])
            .arg(count_file);
        Self::spawn(command)
    }

    /// `manifold-fixture conformance` over HTTP (its tools include the
    /// tasks extension's).
    pub fn conformance() -> Self {
        let mut command = std::process::Command::new(fixture_bin());
        command.args(["conformance", "--http", "127.0.0.1:0"]);
        Self::spawn(command)
    }

    fn spawn(mut command: std::process::Command) -> Self {
        let mut child = command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines
                .next()
                .expect("the fixture said where it listens")
                .unwrap();
            if let Some(url) = line.split("listening on ").nth(1) {
                break url.trim().to_string();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        HttpFixture { child, url }
    }
}

impl Drop for HttpFixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `files.jsonl` in `dir`: one `files` server whose tools are `(name,
/// description, annotations)`, each taking arguments of `schema`.
pub fn write_files_catalog(dir: &Path, schema: &Value, tools: &[(&str, &str, Value)]) -> PathBuf {
    let text: String = tools
        .iter()
        .map(|(name, description, annotations)| {
            serde_json::json!({"id": format!("files::{name}"), "server": "files", "name": name,
                   "description": description, "input_schema": schema, "annotations": annotations})
            .to_string()
                + "\n"
        })
        .collect();
    let path = dir.join("files.jsonl");
    std::fs::write(&path, text).unwrap();
    path
}
