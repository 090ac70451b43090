//! The `rerank` strategy against chat endpoints that the test starts on
//! loopback: one that answers, one that is too slow, one that fails.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::{Json, Router, extract::State, routing::post};
use manifold_embed::{ChatApi, ChatReranker, RerankConfig};
use manifold_search::{SearchIndex, Strategy, ToolDoc};
use serde_json::{Value, json};

#[derive(Clone)]
struct Behaviour {
    delay: Duration,
    answer: &'static str,
    fail: bool,
}

/// An OpenAI-style `/v1/chat/completions` and an Anthropic-style
/// `/v1/messages`, answering `answer` after `delay`.
async fn chat(
    State(b): State<Behaviour>,
    Json(body): Json<Value>,
) -> Result<Json<Value>, axum::http::StatusCode> {
    tokio::time::sleep(b.delay).await;
    if b.fail {
        return Err(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert!(
        body["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("[0]")
    );
    Ok(Json(json!({
        "choices": [{"message": {"role": "assistant", "content": b.answer}}],
        "content": [{"type": "text", "text": b.answer}],
    })))
}

async fn start(b: Behaviour) -> String {
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/messages", post(chat))
        .with_state(b);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
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

fn index() -> SearchIndex {
    SearchIndex::build(vec![
        tool("fs", "read_file", "Read a file."),
        tool("fs", "write_file", "Write a file."),
        tool("fs", "delete_file", "Delete a file."),
        tool("git", "log", "Show the commit log."),
    ])
}

fn ids(hits: &[manifold_search::Hit]) -> Vec<&str> {
    hits.iter().map(|h| h.id.as_str()).collect()
}

const QUERY: &str = "write a file";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reranker_reorders_the_hybrid_ranking() {
    let base = start(Behaviour {
        delay: Duration::ZERO,
        answer: "2, 0",
        fail: false,
    })
    .await;
    let plain = index();
    let (ran, hybrid) = plain.run(Strategy::Hybrid, QUERY, 3, &|_| true).unwrap();
    assert_eq!(ran, Strategy::Bm25, "no vectors: hybrid is bm25");
    assert_eq!(hybrid[0].id, "fs__write_file");
    for (api, path) in [
        (ChatApi::OpenAi, "/v1/chat/completions"),
        (ChatApi::Anthropic, "/v1/messages"),
    ] {
        let reranker = ChatReranker::new(
            &format!("{base}{path}"),
            "m",
            api,
            None,
            Duration::from_secs(5),
            10,
        )
        .unwrap();
        let index = index().with_reranker(Arc::new(reranker));
        let (ran, hits) = tokio::task::block_in_place(|| {
            index.run(Strategy::Rerank, QUERY, 3, &|_| true).unwrap()
        });
        assert_eq!(ran, Strategy::Rerank);
        // Candidates 2 and 0 first, then the rest in hybrid order.
        let all = plain.query(Strategy::Hybrid, QUERY, 10, &|_| true).unwrap();
        let mut want = vec![all[2].id.as_str(), all[0].id.as_str()];
        let rest: Vec<&str> = ids(&all)
            .into_iter()
            .filter(|id| !want.contains(id))
            .collect();
        want.extend(rest);
        want.truncate(3);
        assert_eq!(ids(&hits), want, "{api:?}");
        assert!(hits.windows(2).all(|w| w[0].score > w[1].score));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reranker_falls_back_to_hybrid_on_a_timeout() {
    let base = start(Behaviour {
        delay: Duration::from_secs(5),
        answer: "3, 2, 1, 0",
        fail: false,
    })
    .await;
    let config: RerankConfig = toml::from_str(&format!(
        "url = \"{base}/v1/chat/completions\"\nmodel = \"m\"\ntimeout_ms = 300\ntop_k = 4\n"
    ))
    .unwrap();
    let index = index().with_reranker(config.reranker().unwrap());
    let want = index.query(Strategy::Hybrid, QUERY, 3, &|_| true).unwrap();
    let started = Instant::now();
    let (ran, hits) =
        tokio::task::block_in_place(|| index.run(Strategy::Rerank, QUERY, 3, &|_| true).unwrap());
    let took = started.elapsed();
    assert_eq!(
        ran,
        Strategy::Bm25,
        "the hybrid ranking (bm25 without vectors) is used"
    );
    assert_eq!(hits, want);
    assert!(took < Duration::from_secs(2), "waited {took:?}");
    assert!(
        took >= Duration::from_millis(250),
        "did not wait for the timeout: {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_or_unreadable_reranker_falls_back_too() {
    let failing = start(Behaviour {
        delay: Duration::ZERO,
        answer: "",
        fail: true,
    })
    .await;
    let nonsense = start(Behaviour {
        delay: Duration::ZERO,
        answer: "I cannot say.",
        fail: false,
    })
    .await;
    for base in [failing, nonsense] {
        let reranker = ChatReranker::new(
            &format!("{base}/v1/chat/completions"),
            "m",
            ChatApi::OpenAi,
            None,
            Duration::from_secs(5),
            10,
        )
        .unwrap();
        let index = index().with_reranker(Arc::new(reranker));
        let want = index.query(Strategy::Hybrid, QUERY, 3, &|_| true).unwrap();
        let (ran, hits) = tokio::task::block_in_place(|| {
            index.run(Strategy::Rerank, QUERY, 3, &|_| true).unwrap()
        });
        assert_eq!(ran, Strategy::Bm25);
        assert_eq!(hits, want);
    }
    // Without a reranker the strategy is refused, clearly.
    let err = index()
        .run(Strategy::Rerank, QUERY, 3, &|_| true)
        .unwrap_err();
    assert!(
        err.to_string().contains("no reranker is configured"),
        "{err}"
    );
}
