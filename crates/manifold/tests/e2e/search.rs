//! `search_tools` end to end: a real `manifold serve` in progressive mode over
//! a fixture server, a real MCP client over HTTP, tokens from the real CLI,
//! and (where `scripts/install-test-deps.sh` installed it) the real
//! all-MiniLM-L6-v2 model behind the `embedding` and `hybrid` strategies.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::{Value, json};

/// The model directory, or `None` (said on stderr) when it is not installed.
/// Under CI (`CI` set) a missing model is a failure.
fn model_dir() -> Option<PathBuf> {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    match manifold_embed::resolve_model_dir(None, &[workspace]) {
        Ok(dir) => Some(dir),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped the model part: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// A file server with a read-only, a write and a destructive tool.
fn files_catalog(dir: &Path) -> PathBuf {
    let schema = json!({"type": "object", "properties": {"path": {"type": "string", "description": "The file's path."}}});
    let rows = [
        (
            "read_file",
            "Read a file from disk.",
            json!({"readOnlyHint": true}),
        ),
        (
            "write_file",
            "Write text to a file on disk.",
            json!({"readOnlyHint": false, "destructiveHint": false}),
        ),
        (
            "delete_file",
            "Delete a file from disk.",
            json!({"readOnlyHint": false, "destructiveHint": true}),
        ),
    ];
    write_files_catalog(dir, &schema, &rows)
}

fn cli_token(config: &Path, args: &[&str]) -> String {
    let created: Value = serde_json::from_str(&cli(
        config,
        &[&["token", "create", "--json"], args].concat(),
    ))
    .unwrap();
    created["token"].as_str().unwrap().to_string()
}

fn embedding_section(model: &Path, cache: &Path) -> String {
    format!(
        "[search.embedding]\nmodel_dir = {:?}\ncache_dir = {:?}\n\n",
        model.display().to_string(),
        cache.display().to_string()
    )
}

fn logged(gw: &GatewayProcess, needle: &str) -> Option<String> {
    gw.startup.iter().find(|l| l.contains(needle)).cloned()
}

/// `key=value` from a log line.
fn field(line: &str, key: &str) -> usize {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {line}"))
        .parse()
        .unwrap()
}

async fn search(client: &Client, args: Value) -> (bool, Value, String) {
    let result = call(client, "search_tools", args).await;
    let error = result.is_error == Some(true);
    let body = if error { Value::Null } else { json(&result) };
    (error, body, text(&result))
}

/// A token whose policy hides the write and destructive tools never gets
/// them from `search_tools`, whatever the strategy, query or limit; another
/// token does (so the queries really would find them).
#[tokio::test(flavor = "multi_thread")]
async fn policy_filtered_search_never_leaks_a_hidden_tool() {
    let data = tempfile::tempdir().unwrap();
    let files = fixture_server("files", &files_catalog(data.path()), &[], "");
    let model = model_dir();
    let embedding = match &model {
        Some(dir) => embedding_section(dir, &data.path().join("cache")),
        None => "[search.embedding]\nenabled = false\n\n".to_string(),
    };
    let gw = GatewayProcess::start(&format!(
        "[gateway]\nmode = \"progressive\"\n\n[auth]\nrequired = true\n\n{embedding}\
         [[policies]]\nprincipal = \"group:readers\"\ntier = \"write\"\neffect = \"deny\"\n\n\
         [[policies]]\nprincipal = \"group:readers\"\ntier = \"destructive\"\neffect = \"deny\"\n\n{files}"
    ));
    let config = gw.dir.path().join("manifold.toml");
    let reader = cli_token(&config, &["--name", "reader", "--group", "readers"]);
    let agent = cli_token(&config, &["--name", "agent"]);

    let mut strategies = vec!["bm25", "regex", "hybrid"];
    if model.is_some() {
        strategies.push("embedding");
    }
    let queries = [
        ("file", "file"),
        ("write text to a file", "write|delete"),
        ("delete a file from disk", "delete_file"),
    ];

    let agent_client = connect(&gw.url, Some(&agent)).await;
    let reader_client = connect(&gw.url, Some(&reader)).await;
    for strategy in &strategies {
        for (words, pattern) in queries {
            let query = if *strategy == "regex" { pattern } else { words };
            for limit in [1, 2, 3, 10] {
                let args = json!({"query": query, "strategy": strategy, "limit": limit});
                let (error, all, message) = search(&agent_client, args.clone()).await;
                assert!(!error, "{strategy} {query}: {message}");
                let (error, seen, message) = search(&reader_client, args).await;
                assert!(!error, "{strategy} {query}: {message}");
                let seen = found_names(&seen);
                assert!(
                    seen.iter().all(|n| n == "files__read_file"),
                    "{strategy} {query:?} limit {limit}: the reader saw {seen:?}"
                );
                if limit == 10 && *strategy != "regex" {
                    // Every strategy but regex ranks every tool it can.
                    assert!(found_names(&all).len() >= 2, "{strategy} {query:?}: {all}");
                }
            }
        }
    }
    // The hidden tools are there for the other token.
    let (_, all, _) = search(
        &agent_client,
        json!({"query": "write|delete", "strategy": "regex", "limit": 10}),
    )
    .await;
    let mut names = found_names(&all);
    names.sort();
    assert_eq!(names, ["files__delete_file", "files__write_file"]);
    agent_client.cancel().await.unwrap();
    reader_client.cancel().await.unwrap();
}

/// A pattern whose compiled program would be huge is refused with an error
/// that says why and what to do, and the gateway goes on answering.
#[tokio::test(flavor = "multi_thread")]
async fn regex_strategy_refuses_catastrophic_patterns_with_a_clear_error() {
    let data = tempfile::tempdir().unwrap();
    let files = fixture_server("files", &files_catalog(data.path()), &[], "");
    let gw = GatewayProcess::start(&format!(
        "[gateway]\nmode = \"progressive\"\n\n[search.embedding]\nenabled = false\n\n{files}"
    ));
    let client = connect(&gw.url, None).await;
    for (pattern, says) in [
        (r"(\w{100}){100}", "too complex"),
        (r"((\w+)+\s?){1000}", "too complex"),
        (&*"a".repeat(300), "the limit is 256"),
        ("(unclosed", "invalid regex"),
    ] {
        let (error, _, message) =
            search(&client, json!({"query": pattern, "strategy": "regex"})).await;
        assert!(error, "{pattern}: accepted");
        assert!(message.contains(says), "{pattern}: {message}");
    }
    let (error, found, message) =
        search(&client, json!({"query": "^read", "strategy": "regex"})).await;
    assert!(!error, "{message}");
    assert_eq!(found_names(&found), ["files__read_file"]);
    client.cancel().await.unwrap();
}

/// No model where one is configured: the gateway still starts, says so in
/// its log, searches with bm25 by default and refuses `embedding` clearly.
#[tokio::test(flavor = "multi_thread")]
async fn without_a_model_the_gateway_starts_with_bm25_and_says_so() {
    let data = tempfile::tempdir().unwrap();
    let files = fixture_server("files", &files_catalog(data.path()), &[], "");
    let missing = data.path().join("no-model-here");
    let gw = GatewayProcess::start(&format!(
        "[gateway]\nmode = \"progressive\"\nsearch_strategy = \"hybrid\"\n\n{}{files}",
        embedding_section(&missing, &data.path().join("cache"))
    ));
    let line = logged(&gw, "embeddings unavailable").unwrap_or_else(|| {
        panic!("no warning in {:#?}", gw.startup);
    });
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("no-model-here"), "{line}");
    assert!(
        logged(&gw, "default strategy is bm25").is_some(),
        "{:#?}",
        gw.startup
    );

    let client = connect(&gw.url, None).await;
    let (error, found, message) = search(&client, json!({"query": "read a file"})).await;
    assert!(!error, "{message}");
    assert_eq!(found["strategy"], "bm25");
    assert_eq!(found_names(&found)[0], "files__read_file");
    let (error, found, _) = search(
        &client,
        json!({"query": "read a file", "strategy": "hybrid"}),
    )
    .await;
    assert!(!error);
    assert_eq!(found["strategy"], "bm25", "hybrid without vectors is bm25");
    let (error, _, message) = search(
        &client,
        json!({"query": "read a file", "strategy": "embedding"}),
    )
    .await;
    assert!(error);
    assert!(message.contains("not available"), "{message}");
    client.cancel().await.unwrap();
}

/// The tool vectors a gateway computed are on disk: a restart over the same
/// catalog embeds nothing, and a changed tool is the only one embedded again.
#[tokio::test(flavor = "multi_thread")]
async fn the_embedding_cache_is_reused_across_restarts() {
    let Some(model) = model_dir() else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let catalog = files_catalog(data.path());
    let cache = data.path().join("cache");
    let config = |catalog: &Path| {
        format!(
            "[gateway]\nmode = \"progressive\"\n\n{}{}",
            embedding_section(&model, &cache),
            fixture_server("files", catalog, &[], "")
        )
    };
    let ready = |gw: &GatewayProcess| {
        logged(gw, "search: index ready")
            .unwrap_or_else(|| panic!("no index line in {:#?}", gw.startup))
    };

    let first = GatewayProcess::start(&config(&catalog));
    assert!(logged(&first, "embedding model loaded").is_some());
    let line = ready(&first);
    assert_eq!(field(&line, "embedded"), 3, "{line}");
    assert_eq!(field(&line, "reused"), 0, "{line}");
    let client = connect(&first.url, None).await;
    let (error, found, message) = search(
        &client,
        json!({"query": "remove a file", "strategy": "embedding"}),
    )
    .await;
    assert!(!error, "{message}");
    assert_eq!(found["strategy"], "embedding");
    assert_eq!(found_names(&found)[0], "files__delete_file", "{found}");
    client.cancel().await.unwrap();
    drop(first);

    let second = GatewayProcess::start(&config(&catalog));
    let line = ready(&second);
    assert_eq!(
        field(&line, "embedded"),
        0,
        "a restart embeds nothing: {line}"
    );
    assert_eq!(field(&line, "reused"), 3, "{line}");
    drop(second);

    // One tool's description changes: only it is embedded again.
    let text = std::fs::read_to_string(&catalog)
        .unwrap()
        .replace("Read a file from disk.", "Read the lines of a text file.");
    std::fs::write(&catalog, text).unwrap();
    let third = GatewayProcess::start(&config(&catalog));
    let line = ready(&third);
    assert_eq!(field(&line, "embedded"), 1, "{line}");
    assert_eq!(field(&line, "reused"), 2, "{line}");
}
