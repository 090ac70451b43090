//! The operator's files: `manifold init`, `manifold servers …` and
//! `manifold import`, end to end with the real binary and real fixture
//! servers (stdio and Streamable HTTP).

use crate::common;

use std::{path::Path, process::Command, time::Duration};

use common::*;
use serde_json::{Value, json};

fn manifold(args: &[&str]) -> std::process::Output {
    Command::new(manifold_bin()).args(args).output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = manifold(args);
    assert!(
        out.status.success(),
        "manifold {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn catalog(dir: &Path) -> std::path::PathBuf {
    write_catalog(
        dir,
        "tools.jsonl",
        &[
            (
                "notes",
                "add_note",
                "Add a note.",
                json!({"type": "object"}),
            ),
            ("clock", "now", "The time now.", json!({"type": "object"})),
        ],
    )
}

async fn tool_names(url: &str) -> Vec<String> {
    let client = connect(url, None).await;
    let tools = client.peer().list_all_tools().await.unwrap();
    client.cancel().await.unwrap();
    let mut names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    names.sort();
    names
}

#[tokio::test]
async fn init_writes_a_config_that_serves() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manifold.toml");
    let path_str = path.to_str().unwrap();
    ok(&["init", "--config", path_str]);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("# [[servers]]"), "commented examples: {text}");
    let err = manifold(&["init", "--config", path_str]);
    assert!(!err.status.success(), "init never overwrites");
    let gw = GatewayProcess::start_file(&path, &[]);
    let health = reqwest::get(gw.url.replace("/mcp", "/healthz"))
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);
    // No servers yet: a small catalog, so direct mode, and an empty list.
    assert_eq!(tool_names(&gw.url).await, Vec::<String>::new());
    let stats = ok(&["catalog", "stats", "--config", path_str]);
    assert!(stats.contains("0 servers"), "{stats}");
}

/// `servers add` lasts across a restart; `disable` and `remove` reach a
/// running gateway through its reload, and keep the file's comments.
#[tokio::test]
async fn servers_added_from_the_cli_persist_and_switches_reach_the_running_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let tools = catalog(dir.path());
    let path = dir.path().join("manifold.toml");
    std::fs::write(&path, "# kept\n[gateway]\nmode = \"direct\"\n").unwrap();
    let p = path.to_str().unwrap();
    let fixture = fixture_bin().display().to_string();
    let file = tools.display().to_string();
    for server in ["notes", "clock"] {
        ok(&[
            "servers",
            "add",
            "--config",
            p,
            server,
            "--description",
            "added from the CLI",
            "--",
            &fixture,
            "catalog",
            "--file",
            &file,
            "--server",
            server,
        ]);
    }
    let listed = ok(&["servers", "list", "--config", p]);
    assert!(
        listed.contains("notes") && listed.contains("clock"),
        "{listed}"
    );
    {
        let gw = GatewayProcess::start_file(&path, &[]);
        assert_eq!(tool_names(&gw.url).await, ["clock__now", "notes__add_note"]);
    }
    // A restart reads the same file.
    let gw = GatewayProcess::start_file(&path, &[]);
    assert_eq!(tool_names(&gw.url).await, ["clock__now", "notes__add_note"]);
    ok(&["servers", "disable", "--config", p, "clock"]);
    assert!(
        std::fs::read_to_string(&path)
            .unwrap()
            .contains("enabled = false")
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while tool_names(&gw.url).await != ["notes__add_note"] {
        assert!(
            std::time::Instant::now() < deadline,
            "the reload did not drop clock"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ok(&["servers", "enable", "--config", p, "clock"]);
    ok(&["servers", "remove", "--config", p, "notes"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while tool_names(&gw.url).await != ["clock__now"] {
        assert!(
            std::time::Instant::now() < deadline,
            "the reload did not apply"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        std::fs::read_to_string(&path)
            .unwrap()
            .starts_with("# kept\n")
    );
    let err = manifold(&["servers", "remove", "--config", p, "notes"]);
    assert!(!err.status.success());
    assert!(String::from_utf8_lossy(&err.stderr).contains("no server named 'notes'"));
}

/// A client file: its name, its text, the variables the gateway is given,
/// the entry it cannot convert, and the variables the import must ask for.
type Case<'a> = (
    &'a str,
    String,
    &'a [(&'a str, &'a str)],
    &'a str,
    &'a [&'a str],
);

/// Real-shaped files of the three clients, with stdio and HTTP servers, env
/// and headers: the result loads and connects, literal secrets become
/// `${VAR}`, what cannot be converted is reported, and `--write` keeps the
/// config's comments. (Legacy SSE servers are converted; the Python tests
/// import one and connect to it.)
#[tokio::test]
async fn imports_from_claude_desktop_cursor_and_vscode() {
    let dir = tempfile::tempdir().unwrap();
    let tools = catalog(dir.path());
    let fixture = fixture_bin().display().to_string();
    let file = tools.display().to_string();
    let http = HttpFixture::start(&tools, "clock", &dir.path().join("clock.log"));
    let stdio = |server: &str, env: Value| json!({"command": fixture, "args": ["catalog", "--file", file, "--server", server], "env": env});
    let claude = json!({"mcpServers": {
        "notes": stdio("notes", json!({"NOTES_API_TOKEN": "ghp_0123456789abcdefghijABCDEFGHIJ012345", "TZ": "UTC"})),
        "clock": {"type": "http", "url": http.url, "headers": {"Authorization": "Bearer sk_live_0123456789abcdefghijABCD"}},
        "socket": {"type": "websocket", "url": "wss://example.com/ws"},
    }});
    let cursor = json!({"mcpServers": {
        "notes": stdio("notes", json!({"DEBUG": "1"})),
        "clock": {"url": http.url, "headers": {"X-Api-Key": "abcdefghijklmnop0123456789"}},
        "both": {"command": "x", "url": "https://example.com/mcp"},
    }});
    let vscode = format!(
        "{{\n  // written by VS Code\n  \"inputs\": [{{\"type\": \"promptString\", \"id\": \"clock-key\", \"description\": \"Clock key\", \"password\": true}}],\n  \"servers\": {{\n    \"notes\": {{\"type\": \"stdio\", \"command\": {:?}, \"args\": [\"catalog\", \"--file\", {:?}, \"--server\", \"notes\"]}},\n    \"clock\": {{\"type\": \"http\", \"url\": {:?}, \"headers\": {{\"X-Api-Key\": \"${{input:clock-key}}\"}}}},\n  }}\n}}\n",
        fixture, file, http.url
    );
    let cases: [Case; 3] = [
        (
            "claude_desktop_config.json",
            claude.to_string(),
            &[("NOTES_API_TOKEN", "t"), ("CLOCK_AUTHORIZATION", "k")],
            "socket",
            &["NOTES_API_TOKEN", "CLOCK_AUTHORIZATION"],
        ),
        (
            "mcp.json",
            cursor.to_string(),
            &[("CLOCK_X_API_KEY", "k")],
            "both",
            &["CLOCK_X_API_KEY"],
        ),
        (
            "vscode-mcp.json",
            vscode,
            &[("CLOCK_CLOCK_KEY", "k")],
            "",
            &["CLOCK_CLOCK_KEY"],
        ),
    ];
    for (name, text, env, unsupported, variables) in cases {
        let source = dir.path().join(name);
        std::fs::write(&source, &text).unwrap();
        let out = manifold(&["import", "--from", source.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let toml = String::from_utf8_lossy(&out.stdout).into_owned();
        let report = String::from_utf8_lossy(&out.stderr).into_owned();
        for secret in ["ghp_0123", "sk_live_", "abcdefghijklmnop0123456789"] {
            assert!(
                !toml.contains(secret),
                "{name}: a secret stayed in the TOML:\n{toml}"
            );
        }
        for var in variables {
            assert!(
                toml.contains(&format!("${{{var}}}")),
                "{name}: {var} in\n{toml}"
            );
            assert!(
                report.contains(var),
                "{name}: {var} is to be set:\n{report}"
            );
        }
        if !unsupported.is_empty() {
            assert!(
                report.contains(&format!("not converted: {unsupported}")),
                "{name}: {report}"
            );
        }
        // It loads and connects: both servers' tools are listed.
        let config = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &config,
            format!("# mine\n[gateway]\nmode = \"direct\"\n\n{toml}"),
        )
        .unwrap();
        let gw = GatewayProcess::start_file(&config, env);
        assert_eq!(
            tool_names(&gw.url).await,
            ["clock__now", "notes__add_note"],
            "{name}:\n{toml}"
        );
    }

    // --write merges into an existing config and keeps its comments.
    let target = dir.path().join("manifold.toml");
    std::fs::write(
        &target,
        "# operator's notes\n[gateway]\nmode = \"direct\" # keep me\n",
    )
    .unwrap();
    let source = dir.path().join("claude_desktop_config.json");
    ok(&[
        "import",
        "--from",
        source.to_str().unwrap(),
        "--config",
        target.to_str().unwrap(),
        "--write",
    ]);
    let written = std::fs::read_to_string(&target).unwrap();
    assert!(written.starts_with("# operator's notes\n"), "{written}");
    assert!(written.contains("mode = \"direct\" # keep me"), "{written}");
    assert!(
        written.contains("name = \"notes\"") && written.contains("name = \"clock\""),
        "{written}"
    );
    assert!(!written.contains("ghp_0123"), "{written}");
}
