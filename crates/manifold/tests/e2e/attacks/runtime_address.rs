//! A server added at run time and persisted keeps its address check: it is
//! written with `origin = "runtime"`, and every connect resolves and checks
//! its host again, after a restart too. Here the name is `localhost`, allowed
//! when the server is added; once `[admin] allowed_hosts` no longer names it,
//! the restarted gateway refuses to connect, and the internal service sees
//! nothing. (A name whose second DNS answer is private meets the same check:
//! `manifold_upstream::address`'s tests drive it with a resolver they
//! control.)

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;

async fn server_state(http: &reqwest::Client, base: &str, token: &str) -> Value {
    http.get(format!("{base}/admin/servers/internal"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_persisted_runtime_server_is_checked_again_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = write_catalog(
        dir.path(),
        "tools.jsonl",
        &[(
            "internal",
            "read_secrets",
            "Read the internal secrets.",
            json!({"type": "object", "properties": {}}),
        )],
    );
    let count = dir.path().join("internal.log");
    let internal = HttpFixture::start(&catalog, "internal", &count);
    let url = internal.url.replace("127.0.0.1", "localhost");
    let config = dir.path().join("manifold.toml");
    let write_config = |allowed: &str| {
        let mut text = format!(
            "[gateway]\nmode = \"direct\"\n\n[auth]\nrequired = true\n\n\
             [admin]\nallow_runtime_servers = true\nallowed_hosts = [{allowed}]\n"
        );
        // Keep what the gateway wrote into the file.
        if let Ok(old) = std::fs::read_to_string(&config)
            && let Some(at) = old.find("[[servers]]")
        {
            text.push('\n');
            text.push_str(&old[at..]);
        }
        std::fs::write(&config, text).unwrap();
    };
    write_config("\"localhost\"");
    let http = reqwest::Client::new();

    let gw = GatewayProcess::start_file(&config, &[]);
    let base = gw.url.trim_end_matches("/mcp").to_string();
    let created: Value = serde_json::from_str(&cli(
        &config,
        &[
            "token", "create", "--name", "ops", "--action", "admin", "--json",
        ],
    ))
    .unwrap();
    let token = created["token"].as_str().unwrap().to_string();
    let added = http
        .post(format!("{base}/admin/servers"))
        .bearer_auth(&token)
        .json(&json!({"name": "internal", "url": url, "persist": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        added.status().as_u16(),
        201,
        "{}",
        added.text().await.unwrap()
    );
    let written = std::fs::read_to_string(&config).unwrap();
    assert!(written.contains("origin = \"runtime\""), "{written}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = server_state(&http, &base, &token).await;
        if state["state"] == "connected" {
            break;
        }
        assert!(Instant::now() < deadline, "never connected: {state}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(gw);

    // The operator takes localhost off the list; the entry stays in the file.
    write_config("");
    let seen_before = count_requests(&count, "");
    let gw = GatewayProcess::start_file(&config, &[]);
    let base = gw.url.trim_end_matches("/mcp").to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    let state = loop {
        let state = server_state(&http, &base, &token).await;
        if state["error"].is_string() || state["state"] == "connected" {
            break state;
        }
        assert!(Instant::now() < deadline, "no connect was tried: {state}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_ne!(state["state"], "connected", "{state}");
    assert!(
        state["error"]
            .as_str()
            .is_some_and(|e| e.contains("loopback, private or link-local")),
        "{state}"
    );
    assert_eq!(
        count_requests(&count, ""),
        seen_before,
        "the internal service was reached after the restart"
    );
}
