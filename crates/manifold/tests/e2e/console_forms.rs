//! The console's forms on a real gateway: who may use them, the playground's
//! call through the broker as the signed-in operator, and servers kept in
//! the config file across a restart.

use crate::common;

use common::*;
use serde_json::{Value, json};

fn catalog(dir: &std::path::Path) -> std::path::PathBuf {
    let loose = json!({"type": "object", "properties": {"path": {"type": "string"}}});
    let strict = json!({
        "type": "object",
        "properties": {"path": {"type": "string"}, "max": {"type": "integer"}},
        "required": ["path"]
    });
    write_catalog(
        dir,
        "tools.jsonl",
        &[
            ("files", "read", "Read a file.", loose.clone()),
            ("files", "count_lines", "Count a file's lines.", strict),
            ("notes", "list_notes", "List notes.", loose.clone()),
            ("notes", "add_note", "Add a note.", loose),
        ],
    )
}

fn config(tools: &std::path::Path, runtime_servers: bool) -> String {
    format!(
        "# the operator's own words\n[gateway]\nmode = \"progressive\"\n\n[auth]\nrequired = true\n\n\
         [search.embedding]\nenabled = false\n\n\
         [admin]\nallow_runtime_servers = {runtime_servers}\nallowed_commands = [{:?}]\n\n{}",
        fixture_bin().display().to_string(),
        fixture_server("files", tools, &[], ""),
    )
}

fn token(config: &std::path::Path, name: &str, actions: &[&str]) -> String {
    let mut args = vec!["token", "create", "--name", name, "--json"];
    for action in actions {
        args.extend(["--action", action]);
    }
    let created: Value = serde_json::from_str(&cli(config, &args)).unwrap();
    created["token"].as_str().unwrap().to_string()
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn sign_in(base: &str, token: &str) -> String {
    let response = http()
        .post(format!("{base}/console/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 303);
    let set = response.headers()["set-cookie"].to_str().unwrap();
    set.split(';').next().unwrap().to_string()
}

/// The playground's call form as the console's script sends it.
async fn playground_call(base: &str, cookie: &str, form: Value) -> (u16, String) {
    let response = http()
        .post(format!("{base}/console/playground/call"))
        .header("cookie", cookie)
        .header("x-manifold-console", "1")
        .json(&form)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test]
async fn console_forms_are_refused_without_an_admin_session_and_the_console_header() {
    let dir = tempfile::tempdir().unwrap();
    let tools = catalog(dir.path());
    let gw = GatewayProcess::start(&config(&tools, true));
    let path = gw.dir.path().join("manifold.toml");
    let admin = token(&path, "ops", &["admin", "discover", "call"]);
    let agent = token(&path, "agent", &[]);
    let base = gw.url.trim_end_matches("/mcp").to_string();
    let http = http();
    let form = json!({"tool": "files__read", "arg.path": "/a"});

    // No session, or a token without the admin action: the sign-in page.
    for bearer in [None, Some(agent.as_str())] {
        for (method, route) in [
            ("GET", "/console/playground"),
            ("GET", "/console/playground?q=read&tool=files__read"),
            ("GET", "/console/servers/files"),
            ("POST", "/console/playground/call"),
        ] {
            let mut request = match method {
                "GET" => http.get(format!("{base}{route}")),
                _ => http.post(format!("{base}{route}")).json(&form),
            }
            .header("x-manifold-console", "1");
            if let Some(bearer) = bearer {
                request = request.bearer_auth(bearer);
            }
            let response = request.send().await.unwrap();
            assert_eq!(
                response.status().as_u16(),
                303,
                "{method} {route} as {bearer:?}"
            );
            assert_eq!(response.headers()["location"], "/console/login");
        }
        // The server forms' admin routes answer 401 and 403.
        let mut remove = http.delete(format!("{base}/admin/servers/files"));
        if let Some(bearer) = bearer {
            remove = remove.bearer_auth(bearer);
        }
        let status = remove.send().await.unwrap().status().as_u16();
        assert_eq!(status, if bearer.is_some() { 403 } else { 401 });
    }
    assert_eq!(
        std::fs::read_to_string(&path)
            .unwrap()
            .matches("[[servers]]")
            .count(),
        1,
        "nothing was removed"
    );

    // Signed in, a state-changing request still needs the console's header,
    // which a cross-site form cannot send.
    let cookie = sign_in(&base, &admin).await;
    let page = http
        .get(format!("{base}/console/playground?q=read&tool=files__read"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status().as_u16(), 200);
    let html = page.text().await.unwrap();
    assert!(html.contains("id=\"playground-stub\""), "{html}");
    let bare = http
        .post(format!("{base}/console/playground/call"))
        .header("cookie", &cookie)
        .json(&form)
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status().as_u16(), 403);
    let bare = http
        .delete(format!("{base}/admin/servers/files"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status().as_u16(), 403);
    let server_page = http
        .get(format!("{base}/console/servers/files"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(server_page.status().as_u16(), 200);
    assert!(
        server_page
            .text()
            .await
            .unwrap()
            .contains("id=\"chart-data\""),
        "the server page has its chart"
    );
}

#[tokio::test]
async fn the_playground_calls_through_the_broker_as_the_operator_so_policy_applies() {
    let dir = tempfile::tempdir().unwrap();
    let tools = catalog(dir.path());
    let gw = GatewayProcess::start(&config(&tools, false));
    let path = gw.dir.path().join("manifold.toml");
    let admin = token(&path, "ops", &["admin", "discover", "call"]);
    let base = gw.url.trim_end_matches("/mcp").to_string();
    let cookie = sign_in(&base, &admin).await;

    // Valid: forwarded, with the operator's own activity row.
    let (status, html) = playground_call(
        &base,
        &cookie,
        json!({"tool": "files__count_lines", "arg.path": "/a", "arg.max": "3"}),
    )
    .await;
    assert_eq!(status, 200, "{html}");
    assert!(html.contains("data-outcome=\"ok\""), "{html}");
    assert!(
        html.contains("data-decision=\"allowed\" data-outcome=\"success\""),
        "{html}"
    );

    // Invalid: the broker's validation, each message at its field; not forwarded.
    let (_, html) = playground_call(
        &base,
        &cookie,
        json!({"tool": "files__count_lines", "arg.max": "three"}),
    )
    .await;
    assert!(
        html.contains("data-outcome=\"invalid_arguments\""),
        "{html}"
    );
    assert!(html.contains("id=\"errors-path\""), "{html}");
    assert!(html.contains("id=\"errors-max\""), "{html}");
    assert!(
        html.contains("value=\"three\""),
        "the typed value stays: {html}"
    );
    assert!(html.contains("data-outcome=\"not_forwarded\""), "{html}");

    // A deny policy refuses the operator's call like anyone's.
    cli(
        &path,
        &[
            "policy", "add", "--effect", "deny", "--server", "files", "--tool", "count_*",
        ],
    );
    // The CLI is another process: the gateway hears it within the governance
    // window (20 ms plus one read on SQLite); wait well past it.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let (_, html) = playground_call(
        &base,
        &cookie,
        json!({"tool": "files__count_lines", "arg.path": "/a"}),
    )
    .await;
    assert!(html.contains("data-outcome=\"denied\""), "{html}");
    assert!(
        html.contains("data-decision=\"denied\" data-outcome=\"not_forwarded\""),
        "{html}"
    );
    let audit = cli_until(
        &path,
        &["audit", "tail", "--kind", "activity", "-n", "1"],
        |out| out.contains("files__count_lines") && out.contains("denied"),
    );
    assert!(
        audit.contains("files__count_lines") && audit.contains("denied"),
        "{audit}"
    );

    // Without the call action, the operator's token is refused too.
    let viewer = token(&path, "viewer", &["admin"]);
    let cookie = sign_in(&base, &viewer).await;
    let (_, html) = playground_call(
        &base,
        &cookie,
        json!({"tool": "files__read", "arg.path": "/a"}),
    )
    .await;
    assert!(!html.contains("data-outcome=\"ok\""), "{html}");
    assert!(html.contains("data-decision=\"denied\""), "{html}");
}

#[tokio::test]
async fn a_server_added_by_form_is_kept_in_the_config_file_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let tools = catalog(dir.path());
    let path = dir.path().join("manifold.toml");
    std::fs::write(&path, config(&tools, true)).unwrap();
    let gw = GatewayProcess::start_file(&path, &[]);
    let admin = token(&path, "ops", &["admin"]);
    let base = gw.url.trim_end_matches("/mcp").to_string();
    let http = http();
    let notes = json!({
        "name": "notes", "description": "Team notes", "persist": true,
        "command": fixture_bin().display().to_string(),
        "args": ["catalog", "--file", tools.display().to_string(), "--server", "notes"],
    });

    // A command outside the allow-list is refused before anything is written.
    let mut refused = notes.clone();
    refused["command"] = json!("/bin/sh");
    let response = http
        .post(format!("{base}/admin/servers"))
        .bearer_auth(&admin)
        .json(&refused)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 403);
    assert!(!std::fs::read_to_string(&path).unwrap().contains("notes"));

    let response = http
        .post(format!("{base}/admin/servers"))
        .bearer_auth(&admin)
        .json(&notes)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
    let added: Value = response.json().await.unwrap();
    assert_eq!(added["state"], "connected", "{added}");
    assert_eq!(added["tools"], 2, "{added}");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("# the operator's own words\n"), "{text}");
    assert!(text.contains("name = \"notes\""), "{text}");
    // The same name again is a conflict.
    let again = http
        .post(format!("{base}/admin/servers"))
        .bearer_auth(&admin)
        .json(&notes)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status().as_u16(), 409);

    // A restart reads it from the file.
    drop(gw);
    let gw = GatewayProcess::start_file(&path, &[]);
    let base = gw.url.trim_end_matches("/mcp").to_string();
    let server: Value = http
        .get(format!("{base}/admin/servers/notes"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(server["tools"], 2, "{server}");

    // Removed by form: gone from the file and from the running gateway.
    let removed = http
        .delete(format!("{base}/admin/servers/notes"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status().as_u16(), 200);
    assert!(!std::fs::read_to_string(&path).unwrap().contains("notes"));
    let gone = http
        .get(format!("{base}/admin/servers/notes"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status().as_u16(), 404);
    let missing = http
        .delete(format!("{base}/admin/servers/notes"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status().as_u16(), 404);
}

#[tokio::test]
async fn server_forms_are_off_unless_runtime_servers_are_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let tools = catalog(dir.path());
    let gw = GatewayProcess::start(&config(&tools, false));
    let path = gw.dir.path().join("manifold.toml");
    let admin = token(&path, "ops", &["admin"]);
    let base = gw.url.trim_end_matches("/mcp").to_string();
    let http = http();
    let before = std::fs::read_to_string(&path).unwrap();
    let add = http
        .post(format!("{base}/admin/servers"))
        .bearer_auth(&admin)
        .json(&json!({"name": "notes", "url": "http://127.0.0.1:9/mcp", "persist": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(add.status().as_u16(), 403);
    let remove = http
        .delete(format!("{base}/admin/servers/files"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(remove.status().as_u16(), 403);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), before);
    let cookie = sign_in(&base, &admin).await;
    let overview = http
        .get(format!("{base}/console"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(overview.contains("id=\"add-server-off\""), "{overview}");
    assert!(!overview.contains("id=\"add-server\""), "{overview}");
}
