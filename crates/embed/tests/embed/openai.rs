//! The OpenAI-compatible endpoint path, against a stub on loopback.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::{Json, Router, extract::State, http::HeaderMap, http::StatusCode, routing::post};
use manifold_embed::{CachedEmbedder, Embedder, EmbeddingConfig, OpenAiEmbedder};
use manifold_search::{SearchIndex, Strategy, ToolDoc};
use serde_json::{Value, json};

/// The stub's API key. Cargo sets `CARGO_PKG_NAME` to it for test processes,
/// so the config path can name a variable that is set without `set_var`.
const KEY: &str = env!("CARGO_PKG_NAME");

#[derive(Default)]
struct Stub {
    requests: AtomicUsize,
}

/// A vector from letter counts, so similar words give similar vectors.
fn letters(text: &str) -> Vec<f32> {
    let mut v = vec![0.0f32; 26];
    for c in text.to_lowercase().bytes().filter(u8::is_ascii_lowercase) {
        v[(c - b'a') as usize] += 1.0;
    }
    v
}

async fn embeddings(
    State(stub): State<Arc<Stub>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Result<Json<Value>, (StatusCode, String)> {
    stub.requests.fetch_add(1, Ordering::Relaxed);
    let want = format!("Bearer {KEY}");
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(want.as_str()) {
        return Err((StatusCode::UNAUTHORIZED, "bad key".into()));
    }
    if body["model"] != "stub-model" {
        return Err((StatusCode::NOT_FOUND, format!("no model {}", body["model"])));
    }
    let inputs = body["input"].as_array().cloned().unwrap_or_default();
    // Out of order on purpose: clients must sort by index.
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .rev()
        .map(|(i, t)| json!({"object": "embedding", "index": i, "embedding": letters(t.as_str().unwrap_or(""))}))
        .collect();
    Ok(Json(
        json!({"object": "list", "data": data, "model": "stub-model"}),
    ))
}

async fn start_stub() -> (String, Arc<Stub>) {
    let stub = Arc::new(Stub::default());
    let app = Router::new()
        .route("/v1/embeddings", post(embeddings))
        .with_state(Arc::clone(&stub));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/embeddings", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, stub)
}

fn tool(server: &str, name: &str, description: &str) -> ToolDoc {
    ToolDoc {
        id: format!("{server}__{name}"),
        server: server.into(),
        name: name.into(),
        description: description.into(),
        ..ToolDoc::default()
    }
}

// Called from inside a tokio runtime on purpose: the gateway will do that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeds_through_an_openai_compatible_endpoint() {
    let (url, stub) = start_stub().await;
    let embedder = OpenAiEmbedder::new(
        &url,
        "stub-model",
        Some(KEY.into()),
        Duration::from_secs(10),
    )
    .unwrap();
    assert!(embedder.model_id().starts_with("openai:http://127.0.0.1:"));
    assert!(!embedder.model_id().contains(KEY));

    // Order is kept although the stub answers in reverse; 300 texts go in
    // three requests of at most 128.
    let texts: Vec<String> = (0..300).map(|i| "a".repeat(i % 7 + 1)).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let vectors = embedder.embed(&refs).unwrap();
    assert_eq!(vectors.len(), 300);
    for (t, v) in texts.iter().zip(&vectors) {
        assert_eq!(v[0], t.len() as f32);
    }
    assert_eq!(stub.requests.load(Ordering::Relaxed), 3);

    // Through the config, the cache and a search index, with hybrid search.
    let cache = tempfile::tempdir().unwrap();
    let config = EmbeddingConfig {
        url: Some(url.clone()),
        model: Some("stub-model".into()),
        api_key_env: Some("CARGO_PKG_NAME".into()),
        cache_dir: Some(cache.path().to_path_buf()),
        ..EmbeddingConfig::default()
    };
    let cached: Arc<CachedEmbedder> = config.open(&[]).unwrap();
    let index = SearchIndex::build(vec![
        tool("weather", "forecast", "weather forecast"),
        tool("fs", "read_file", "read a file from disk"),
        tool("mail", "send_email", "send an email message"),
    ])
    .with_embeddings(cached.clone())
    .unwrap();
    assert_eq!(cached.embedded(), 3);
    let hidden_fs = |d: &ToolDoc| d.server != "fs";
    for strategy in [Strategy::Embedding, Strategy::Hybrid] {
        let hits = index
            .query(strategy, "weather forecast", 3, &hidden_fs)
            .unwrap();
        assert_eq!(hits[0].id, "weather__forecast", "{strategy}");
        assert!(hits.iter().all(|h| h.id != "fs__read_file"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_errors_are_reported() {
    let (url, _stub) = start_stub().await;
    let wrong_key = OpenAiEmbedder::new(
        &url,
        "stub-model",
        Some("nope".into()),
        Duration::from_secs(10),
    )
    .unwrap();
    let err = wrong_key.embed(&["x"]).unwrap_err();
    assert!(err.0.contains("401"), "{err}");

    let wrong_model =
        OpenAiEmbedder::new(&url, "other", Some(KEY.into()), Duration::from_secs(10)).unwrap();
    let err = wrong_model.embed(&["x"]).unwrap_err();
    assert!(err.0.contains("404") && err.0.contains("no model"), "{err}");

    // Nothing listens on this port (it was just closed).
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let down = OpenAiEmbedder::new(
        &format!("http://{closed}/v1/embeddings"),
        "stub-model",
        None,
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(down.embed(&["x"]).is_err());

    assert!(OpenAiEmbedder::new("not a url", "m", None, Duration::from_secs(1)).is_err());
    let missing_key = EmbeddingConfig {
        url: Some(url),
        api_key_env: Some("MANIFOLD_TEST_UNSET_KEY_VARIABLE".into()),
        ..EmbeddingConfig::default()
    };
    let err = missing_key.embedder(&[]).err().unwrap();
    assert!(err.0.contains("MANIFOLD_TEST_UNSET_KEY_VARIABLE"), "{err}");
}
