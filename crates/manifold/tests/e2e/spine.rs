//! The gateway spine, end to end: real `manifold serve`, real fixture upstreams
//! over stdio, a real MCP client over Streamable HTTP.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

fn weather_and_tickets(dir: &std::path::Path) -> std::path::PathBuf {
    write_catalog(
        dir,
        "tools.jsonl",
        &[
            (
                "weather",
                "get_forecast",
                "Get the weather forecast for a city for the next days.",
                json!({"type": "object", "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "days": {"type": "integer", "minimum": 1, "maximum": 10}
                }, "required": ["city"]}),
            ),
            (
                "weather",
                "get_alerts",
                "Active severe weather alerts for a region.",
                json!({"type": "object", "properties": {"region": {"type": "string"}}}),
            ),
            (
                "tickets",
                "create_ticket",
                "Open a ticket in the issue tracker.",
                json!({"type": "object", "properties": {
                    "title": {"type": "string"},
                    "priority": {"type": "string", "enum": ["low", "high"]}
                }, "required": ["title", "priority"]}),
            ),
            (
                "tickets",
                "list_tickets",
                "List open tickets.",
                json!({"type": "object", "properties": {}}),
            ),
        ],
    )
}

fn config(mode: &str, servers: &[String]) -> String {
    format!("[gateway]\nmode = \"{mode}\"\n\n{}", servers.join("\n"))
}

#[tokio::test]
async fn get_on_mcp_is_405_with_allow_post() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = weather_and_tickets(dir.path());
    let gw = GatewayProcess::start(&config(
        "progressive",
        &[fixture_server("weather", &catalog, &[], "")],
    ));
    let response = reqwest::Client::new().get(&gw.url).send().await.unwrap();
    assert_eq!(response.status(), 405);
    assert_eq!(response.headers()["allow"], "POST");
    let response = reqwest::Client::new().delete(&gw.url).send().await.unwrap();
    assert_eq!(response.status(), 405);
}

#[tokio::test]
async fn progressive_mode_serves_stable_meta_tools_and_brokers_calls() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = weather_and_tickets(dir.path());
    let gw = GatewayProcess::start(&config(
        "progressive",
        &[
            fixture_server("weather", &catalog, &[], ""),
            fixture_server("tickets", &catalog, &[], ""),
        ],
    ));
    let client = connect(&gw.url, None).await;

    let first = client.peer().list_all_tools().await.unwrap();
    let names: Vec<_> = first.iter().map(|t| t.name.to_string()).collect();
    assert_eq!(
        names,
        [
            "search_tools",
            "get_tool_details",
            "call_tool",
            "search_available_servers",
            "enable_server",
            "disable_server",
            "execute_code"
        ]
    );

    // Search: ranked, grouped by server, at three levels of detail.
    let found = json(
        &call(
            &client,
            "search_tools",
            json!({"query": "weather forecast for a city"}),
        )
        .await,
    );
    assert_eq!(found_names(&found)[0], "weather__get_forecast");
    assert_eq!(found["servers"][0]["server"], "weather");
    assert!(found["servers"][0]["tools"][0]["description"].is_string());
    let names_only = json(
        &call(
            &client,
            "search_tools",
            json!({"query": "ticket", "detail": "name"}),
        )
        .await,
    );
    let first_tool = &names_only["servers"][0]["tools"][0];
    assert!(first_tool.get("description").is_none(), "{first_tool}");
    let full = json(
        &call(
            &client,
            "search_tools",
            json!({"query": "ticket", "detail": "full", "server": "tickets"}),
        )
        .await,
    );
    assert!(full["servers"][0]["tools"][0]["inputSchema"].is_object());
    assert_eq!(full["servers"].as_array().unwrap().len(), 1);
    // Code-mode declarations, from search and from details.
    let typed = json(
        &call(
            &client,
            "search_tools",
            json!({"query": "ticket", "detail": "typescript", "server": "tickets"}),
        )
        .await,
    );
    let ts = typed["typescript"].as_str().unwrap();
    assert!(ts.contains("declare namespace tickets {"), "{ts}");
    assert!(
        ts.contains("function create_ticket(input: CreateTicketInput)"),
        "{ts}"
    );
    assert!(ts.contains("priority: \"low\" | \"high\";"), "{ts}");
    let details = json(
        &call(
            &client,
            "get_tool_details",
            json!({"name": "weather__get_forecast", "format": "typescript"}),
        )
        .await,
    );
    let ts = details["typescript"].as_str().unwrap();
    assert!(ts.contains("declare namespace weather {"), "{ts}");
    assert!(ts.contains("city: string;"), "{ts}");
    assert!(ts.contains("days?: number;"), "{ts}");
    let regex = json(
        &call(
            &client,
            "search_tools",
            json!({"query": "^get_", "strategy": "regex"}),
        )
        .await,
    );
    let mut regex_names = found_names(&regex);
    regex_names.sort();
    assert_eq!(
        regex_names,
        ["weather__get_alerts", "weather__get_forecast"]
    );

    // Details, and "did you mean" for a typo.
    let details = json(
        &call(
            &client,
            "get_tool_details",
            json!({"name": "weather__get_forecast"}),
        )
        .await,
    );
    assert_eq!(
        details["tools"][0]["inputSchema"]["required"],
        json!(["city"])
    );
    let both = json(
        &call(
            &client,
            "get_tool_details",
            json!({"names": ["weather__get_forecast", "tickets__list_tickets"]}),
        )
        .await,
    );
    assert_eq!(both["tools"].as_array().unwrap().len(), 2);
    let typo = call(
        &client,
        "get_tool_details",
        json!({"name": "weather__get_forcast"}),
    )
    .await;
    assert_eq!(typo.is_error, Some(true));
    assert!(text(&typo).contains("Did you mean"), "{}", text(&typo));
    assert!(text(&typo).contains("weather__get_forecast"));

    // Arguments are validated host-side; every violation is listed.
    let bad = call(
        &client,
        "call_tool",
        json!({"name": "tickets__create_ticket", "arguments": {"priority": "urgent"}}),
    )
    .await;
    assert_eq!(bad.is_error, Some(true));
    let message = text(&bad);
    assert!(message.contains("title"), "{message}");
    assert!(message.contains("urgent"), "{message}");
    let ok = call(&client, "call_tool", json!({"name": "tickets__create_ticket", "arguments": {"title": "Disk full", "priority": "high"}})).await;
    assert_ne!(ok.is_error, Some(true), "{}", text(&ok));
    assert!(text(&ok).contains("create_ticket"), "{}", text(&ok));

    // Servers can be found, disabled and enabled again; the tools array never changes.
    let servers = json(
        &call(
            &client,
            "search_available_servers",
            json!({"query": "tickets"}),
        )
        .await,
    );
    assert_eq!(servers["servers"][0]["name"], "tickets");
    assert_eq!(servers["servers"][0]["state"], "connected");
    let off = call(&client, "disable_server", json!({"name": "tickets"})).await;
    assert_ne!(off.is_error, Some(true), "{}", text(&off));
    let gone = json(&call(&client, "search_tools", json!({"query": "ticket"})).await);
    assert!(
        found_names(&gone)
            .iter()
            .all(|n| !n.starts_with("tickets__")),
        "{gone}"
    );
    let on = json(&call(&client, "enable_server", json!({"name": "tickets"})).await);
    assert_eq!(on["tools"], 2);
    let back = json(&call(&client, "search_tools", json!({"query": "ticket"})).await);
    assert!(found_names(&back).contains(&"tickets__create_ticket".to_string()));
    let again = client.peer().list_all_tools().await.unwrap();
    assert_eq!(first, again, "the meta-tool array must not change");
}

#[tokio::test]
async fn direct_mode_exposes_qualified_tools() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = weather_and_tickets(dir.path());
    let gw = GatewayProcess::start(&config(
        "direct",
        &[
            fixture_server("weather", &catalog, &[], ""),
            fixture_server("tickets", &catalog, &[], ""),
        ],
    ));
    let client = connect(&gw.url, None).await;
    let mut names: Vec<_> = client
        .peer()
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "tickets__create_ticket",
            "tickets__list_tickets",
            "weather__get_alerts",
            "weather__get_forecast"
        ]
    );
    let result = call(&client, "weather__get_forecast", json!({"city": "Oslo"})).await;
    assert!(
        text(&result).contains("get_forecast ok"),
        "{}",
        text(&result)
    );
}

fn one_server(dir: &std::path::Path, flags: &[&str], extra: &str) -> (String, std::path::PathBuf) {
    let catalog = weather_and_tickets(dir);
    let count = dir.join("requests.log");
    let mut all = vec!["--count-file", count.to_str().unwrap()];
    all.extend_from_slice(flags);
    (fixture_server("weather", &catalog, &all, extra), count)
}

#[tokio::test]
async fn listing_is_cached_for_ttl_then_refetched() {
    let dir = tempfile::tempdir().unwrap();
    let (server, count) = one_server(
        dir.path(),
        &["--ttl-ms", "2500", "--cache-scope", "public"],
        "",
    );
    let gw = GatewayProcess::start(&config("progressive", &[server]));
    let client = connect(&gw.url, None).await;
    let before = count_requests(&count, "tools/list");
    assert!(before >= 1);
    for _ in 0..5 {
        call(&client, "search_tools", json!({"query": "forecast"})).await;
    }
    assert_eq!(
        count_requests(&count, "tools/list"),
        before,
        "no tools/list within the TTL"
    );
    tokio::time::sleep(Duration::from_millis(2700)).await;
    call(&client, "search_tools", json!({"query": "forecast"})).await;
    assert_eq!(
        count_requests(&count, "tools/list"),
        before + 1,
        "one tools/list after the TTL"
    );
}

/// An upstream that sends `ttlMs: 0` (rmcp fills that in when a 2026-07-28
/// server names none) does not cost a `tools/list` per call: a listing
/// routes calls for a second past its TTL while the background refreshes
/// it, at most every half second. What is listed still follows the TTL.
#[tokio::test]
async fn calls_do_not_relist_a_zero_ttl_upstream_each_time() {
    let dir = tempfile::tempdir().unwrap();
    let (server, count) = one_server(
        dir.path(),
        &["--ttl-ms", "0", "--cache-scope", "public"],
        "",
    );
    let gw = GatewayProcess::start(&config("direct", &[server]));
    let client = connect(&gw.url, None).await;
    call(&client, "weather__get_forecast", json!({"city": "Oslo"})).await;
    let before = count_requests(&count, "tools/list");
    let started = Instant::now();
    for _ in 0..20 {
        let result = call(&client, "weather__get_forecast", json!({"city": "Oslo"})).await;
        assert!(
            text(&result).contains("get_forecast ok"),
            "{}",
            text(&result)
        );
    }
    let took = started.elapsed();
    let relisted = count_requests(&count, "tools/list") - before;
    // One background refresh per started half second, not one per call.
    let allowed = 1 + (took.as_millis() / 500) as usize;
    assert!(
        relisted <= allowed,
        "{relisted} tools/list for 20 calls in {took:?} (at most {allowed})"
    );
    // A listing is still fetched afresh: the TTL is zero.
    let before = count_requests(&count, "tools/list");
    client.list_all_tools().await.unwrap();
    assert_eq!(count_requests(&count, "tools/list"), before + 1);
}

#[tokio::test]
async fn list_changed_invalidates_inside_the_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let (server, count) = one_server(
        dir.path(),
        &[
            "--ttl-ms",
            "600000",
            "--cache-scope",
            "public",
            "--add-tool-after-ms",
            // Long enough that a slow start on a loaded machine still lists
            // before the tool arrives.
            "6000",
        ],
        "",
    );
    let gw = GatewayProcess::start(&config("progressive", &[server]));
    let client = connect(&gw.url, None).await;
    let before = json(&call(&client, "search_tools", json!({"query": "late tool"})).await);
    assert!(!found_names(&before).contains(&"weather__late_tool".to_string()));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = json(&call(&client, "search_tools", json!({"query": "late tool"})).await);
        if found_names(&now).contains(&"weather__late_tool".to_string()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "late_tool never became searchable"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        count_requests(&count, "tools/list"),
        2,
        "exactly one re-list, well inside the TTL"
    );
}

#[tokio::test]
async fn private_listings_are_never_shared_between_callers() {
    let dir = tempfile::tempdir().unwrap();
    let (server, count) = one_server(
        dir.path(),
        &["--ttl-ms", "600000", "--cache-scope", "private"],
        "",
    );
    let gw = GatewayProcess::start(&config("progressive", &[server]));
    let alice = connect(&gw.url, Some("alice-token")).await;
    let bob = connect(&gw.url, Some("bob-token")).await;
    let base = count_requests(&count, "tools/list");
    call(&alice, "search_tools", json!({"query": "forecast"})).await;
    assert_eq!(
        count_requests(&count, "tools/list"),
        base + 1,
        "alice gets her own listing"
    );
    call(&alice, "search_tools", json!({"query": "forecast"})).await;
    assert_eq!(
        count_requests(&count, "tools/list"),
        base + 1,
        "alice reuses her own listing"
    );
    call(&bob, "search_tools", json!({"query": "forecast"})).await;
    assert_eq!(
        count_requests(&count, "tools/list"),
        base + 2,
        "bob never sees alice's listing"
    );
}

#[tokio::test]
async fn unscoped_listing_counts_as_private() {
    let dir = tempfile::tempdir().unwrap();
    let (server, count) = one_server(dir.path(), &["--ttl-ms", "600000"], "");
    let gw = GatewayProcess::start(&config("progressive", &[server]));
    let alice = connect(&gw.url, Some("alice-token")).await;
    let bob = connect(&gw.url, Some("bob-token")).await;
    let base = count_requests(&count, "tools/list");
    call(&alice, "search_tools", json!({"query": "forecast"})).await;
    call(&bob, "search_tools", json!({"query": "forecast"})).await;
    assert_eq!(count_requests(&count, "tools/list"), base + 2);
}

#[tokio::test]
async fn public_listings_are_shared() {
    let dir = tempfile::tempdir().unwrap();
    let (server, count) = one_server(
        dir.path(),
        &["--ttl-ms", "600000", "--cache-scope", "public"],
        "",
    );
    let gw = GatewayProcess::start(&config("progressive", &[server]));
    let alice = connect(&gw.url, Some("alice-token")).await;
    let bob = connect(&gw.url, Some("bob-token")).await;
    let base = count_requests(&count, "tools/list");
    call(&alice, "search_tools", json!({"query": "forecast"})).await;
    call(&bob, "search_tools", json!({"query": "forecast"})).await;
    assert_eq!(count_requests(&count, "tools/list"), base);
}

#[tokio::test]
async fn a_hung_upstream_delays_others_by_at_most_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = weather_and_tickets(dir.path());
    let gw = GatewayProcess::start(&config(
        "progressive",
        &[
            fixture_server(
                "weather",
                &catalog,
                &["--hang-list"],
                "list_timeout_ms = 1500",
            ),
            fixture_server("tickets", &catalog, &[], ""),
        ],
    ));
    let client = connect(&gw.url, Some("someone-new")).await;
    let started = Instant::now();
    let found = json(&call(&client, "search_tools", json!({"query": "ticket"})).await);
    let elapsed = started.elapsed();
    assert!(found_names(&found).contains(&"tickets__create_ticket".to_string()));
    assert!(
        elapsed < Duration::from_millis(1500 + 1000),
        "took {elapsed:?}"
    );
    // The failing server's status is visible, and later listings do not wait again.
    let servers = json(
        &call(
            &client,
            "search_available_servers",
            json!({"query": "weather"}),
        )
        .await,
    );
    let weather = &servers["servers"][0];
    assert_eq!(weather["name"], "weather");
    assert!(
        weather["listing_error"]
            .as_str()
            .unwrap_or("")
            .contains("tools/list"),
        "{weather}"
    );
    let started = Instant::now();
    call(&client, "search_tools", json!({"query": "ticket"})).await;
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_cursor_loop_is_cut_off_with_a_clear_status() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = weather_and_tickets(dir.path());
    let gw = GatewayProcess::start(&config(
        "progressive",
        &[
            fixture_server(
                "weather",
                &catalog,
                &["--cursor-loop", "--tools-per-page", "1"],
                "",
            ),
            fixture_server("tickets", &catalog, &[], ""),
        ],
    ));
    let client = connect(&gw.url, None).await;
    let found = json(&call(&client, "search_tools", json!({"query": "ticket forecast"})).await);
    assert!(found_names(&found).contains(&"tickets__create_ticket".to_string()));
    let servers = json(
        &call(
            &client,
            "search_available_servers",
            json!({"query": "weather"}),
        )
        .await,
    );
    let error = servers["servers"][0]["listing_error"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(error.contains("repeated pagination cursor"), "{servers}");
}

fn zombie_children(parent: u32) -> Vec<String> {
    let mut zombies = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        if fields.len() > 1 && fields[1] == parent.to_string() && fields[0] == "Z" {
            zombies.push(stat);
        }
    }
    zombies
}

#[tokio::test]
async fn a_crashed_stdio_upstream_is_restarted_without_zombies() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = weather_and_tickets(dir.path());
    let gw = GatewayProcess::start(&config(
        "progressive",
        &[fixture_server(
            "weather",
            &catalog,
            &["--crash-after-calls", "1"],
            "",
        )],
    ));
    let client = connect(&gw.url, None).await;
    let args = json!({"name": "weather__get_forecast", "arguments": {"city": "Oslo"}});
    let first = call(&client, "call_tool", args.clone()).await;
    assert_ne!(first.is_error, Some(true), "{}", text(&first));
    let crashed = call(&client, "call_tool", args.clone()).await;
    assert_eq!(
        crashed.is_error,
        Some(true),
        "the crashing call fails cleanly"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let servers = json(&call(&client, "search_available_servers", json!({})).await);
        let weather = &servers["servers"][0];
        if weather["state"] == "connected" && weather["restarts"].as_u64().unwrap_or(0) >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "never restarted: {weather}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = call(&client, "call_tool", args).await;
    assert_ne!(after.is_error, Some(true), "{}", text(&after));
    assert!(
        zombie_children(gw.pid()).is_empty(),
        "{:?}",
        zombie_children(gw.pid())
    );
}

fn stats(config_path: &std::path::Path) -> Value {
    let out = std::process::Command::new(manifold_bin())
        .args(["catalog", "stats", "--json", "--config"])
        .arg(config_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn auto_mode_picks_direct_for_five_tools_and_progressive_for_the_demo() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let small = stats(&root.join("fixtures/small/manifold.toml"));
    let demo = stats(&root.join("fixtures/demo/manifold.toml"));
    for (name, s) in [("small", &small), ("demo", &demo)] {
        let d = &s["decision"];
        println!(
            "{name}: {} tools, {} definition tokens (o200k), threshold {} tokens → {}",
            d["tools"], d["definition_tokens"], d["threshold_tokens"], d["chosen"]
        );
    }
    assert_eq!(small["decision"]["tools"], 5);
    assert_eq!(small["decision"]["chosen"], "direct");
    assert!(demo["decision"]["tools"].as_u64().unwrap() >= 600);
    assert!(demo["servers"].as_array().unwrap().len() >= 40);
    assert_eq!(demo["decision"]["chosen"], "progressive");
}

#[tokio::test]
async fn stdio_mode_serves_one_client() {
    use rmcp::{ServiceExt, transport::TokioChildProcess};
    let dir = tempfile::tempdir().unwrap();
    let catalog = weather_and_tickets(dir.path());
    let path = dir.path().join("manifold.toml");
    std::fs::write(
        &path,
        config(
            "progressive",
            &[fixture_server("weather", &catalog, &[], "")],
        ),
    )
    .unwrap();
    let mut command = tokio::process::Command::new(manifold_bin());
    command.arg("stdio").arg("--config").arg(&path);
    let client = ().serve(TokioChildProcess::new(command).unwrap()).await.unwrap();
    let tools = client.peer().list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 7, "six meta-tools and execute_code");
    let found = json(&call(&client, "search_tools", json!({"query": "alerts"})).await);
    assert_eq!(found_names(&found)[0], "weather__get_alerts");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn dual_era_fixture_upstreams_negotiate_the_modern_era() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = weather_and_tickets(dir.path());
    let path = dir.path().join("manifold.toml");
    std::fs::write(
        &path,
        config(
            "progressive",
            &[fixture_server("weather", &catalog, &[], "")],
        ),
    )
    .unwrap();
    let s = stats(&path);
    assert_eq!(s["servers"][0]["status"]["era"], "modern", "{s}");
    assert_eq!(s["servers"][0]["status"]["protocol_version"], "2026-07-28");
}

#[tokio::test]
async fn the_page_cap_cuts_off_an_endless_listing() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = weather_and_tickets(dir.path());
    let gw = GatewayProcess::start(&config(
        "progressive",
        &[fixture_server(
            "weather",
            &catalog,
            &["--tools-per-page", "1"],
            "max_pages = 1",
        )],
    ));
    let client = connect(&gw.url, None).await;
    let servers = json(&call(&client, "search_available_servers", json!({})).await);
    let error = servers["servers"][0]["listing_error"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(error.contains("page cap of 1"), "{servers}");
}

#[tokio::test]
async fn stdio_reads_its_gateway_token_from_the_environment() {
    use rmcp::{ServiceExt, transport::TokioChildProcess};
    let dir = tempfile::tempdir().unwrap();
    let catalog = weather_and_tickets(dir.path());
    let path = dir.path().join("manifold.toml");
    let servers = config("direct", &[fixture_server("weather", &catalog, &[], "")]);
    std::fs::write(&path, format!("[auth]\nrequired = true\n\n{servers}")).unwrap();
    let stdio = |token: Option<&str>| {
        let mut command = std::process::Command::new(manifold_bin());
        command.arg("stdio").arg("--config").arg(&path);
        command.env_remove("MANIFOLD_TOKEN");
        if let Some(token) = token {
            command.env("MANIFOLD_TOKEN", token);
        }
        command.stdin(std::process::Stdio::null());
        command.output().unwrap()
    };
    let missing = stdio(None);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("MANIFOLD_TOKEN"));
    let forged = stdio(Some(&format!("mfd_{}_{}", "0".repeat(12), "A".repeat(43))));
    assert!(!forged.status.success());
    assert!(String::from_utf8_lossy(&forged.stderr).contains("refused: unknown"));

    let created = std::process::Command::new(manifold_bin())
        .args(["token", "create", "--name", "desktop", "--json", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let token: Value = serde_json::from_slice(&created.stdout).unwrap();
    let mut command = tokio::process::Command::new(manifold_bin());
    command
        .arg("stdio")
        .arg("--config")
        .arg(&path)
        .env("MANIFOLD_TOKEN", token["token"].as_str().unwrap());
    let client = ().serve(TokioChildProcess::new(command).unwrap()).await.unwrap();
    let tools = client.peer().list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 2, "the weather tools");
    client.cancel().await.unwrap();
}
