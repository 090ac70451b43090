//! An OpenAI-compatible `/v1/embeddings` endpoint as an [`Embedder`].
//!
//! [`Embedder`] is synchronous (a local model computes on the calling
//! thread), while reqwest is async. The requests therefore run on one worker
//! thread that owns a small tokio runtime; callers block on a channel. This
//! works from plain threads and from inside another tokio runtime alike, and
//! the runtime is dropped on its own thread, never inside async code.

use std::sync::mpsc;
use std::time::Duration;

use manifold_search::{EmbedError, Embedder};
use serde::Deserialize;
use serde_json::json;

/// Texts per request.
const BATCH: usize = 128;

type Reply = mpsc::Sender<Result<Vec<Vec<f32>>, EmbedError>>;

/// Calls `POST {url}` with `{"model", "input": [texts]}` and reads
/// `data[].embedding` (ordered by `data[].index`).
pub struct OpenAiEmbedder {
    requests: mpsc::Sender<(Vec<String>, Reply)>,
    model_id: String,
}

#[derive(Deserialize)]
struct Response {
    data: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    embedding: Vec<f32>,
    #[serde(default)]
    index: Option<usize>,
}

impl OpenAiEmbedder {
    /// `url` is the full endpoint (`http://host:port/v1/embeddings`); `model`
    /// is sent as is; `api_key`, when given, as a bearer token.
    pub fn new(
        url: &str,
        model: &str,
        api_key: Option<String>,
        timeout: Duration,
    ) -> Result<Self, EmbedError> {
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| EmbedError(format!("invalid embedding url {url:?}: {e}")))?;
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| EmbedError(format!("cannot build the HTTP client: {e}")))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| EmbedError(format!("cannot start the embedding runtime: {e}")))?;
        let (tx, rx) = mpsc::channel::<(Vec<String>, Reply)>();
        let endpoint = Endpoint {
            client,
            url: parsed.clone(),
            model: model.to_string(),
            api_key,
        };
        std::thread::Builder::new()
            .name("manifold-embed-http".into())
            .spawn(move || {
                // Ends when the embedder (the only sender) is dropped.
                while let Ok((texts, reply)) = rx.recv() {
                    let _ = reply.send(runtime.block_on(endpoint.embed(texts)));
                }
            })
            .map_err(|e| EmbedError(format!("cannot start the embedding thread: {e}")))?;
        // The id names the endpoint without credentials or query string.
        let mut shown = parsed;
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        shown.set_query(None);
        Ok(Self {
            requests: tx,
            model_id: format!("openai:{shown}#{model}"),
        })
    }
}

struct Endpoint {
    client: reqwest::Client,
    url: reqwest::Url,
    model: String,
    api_key: Option<String>,
}

impl Endpoint {
    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(BATCH) {
            let mut request = self
                .client
                .post(self.url.clone())
                .json(&json!({ "model": self.model, "input": chunk }));
            if let Some(key) = &self.api_key {
                request = request.bearer_auth(key);
            }
            let fail = |e: reqwest::Error| EmbedError(format!("embedding endpoint: {e}"));
            let response = request.send().await.map_err(fail)?;
            let status = response.status();
            if !status.is_success() {
                let body = response.text().await.unwrap_or_default();
                let body: String = body.chars().take(200).collect();
                return Err(EmbedError(format!(
                    "embedding endpoint answered {status}: {body}"
                )));
            }
            let mut parsed: Response = response.json().await.map_err(fail)?;
            if parsed.data.len() != chunk.len() {
                return Err(EmbedError(format!(
                    "embedding endpoint returned {} vectors for {} texts",
                    parsed.data.len(),
                    chunk.len()
                )));
            }
            parsed.data.sort_by_key(|item| item.index);
            out.extend(parsed.data.into_iter().map(|item| item.embedding));
        }
        Ok(out)
    }
}

impl Embedder for OpenAiEmbedder {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let (reply, answer) = mpsc::channel();
        let texts = texts.iter().map(|t| t.to_string()).collect();
        self.requests
            .send((texts, reply))
            .map_err(|_| EmbedError::new("the embedding thread has stopped"))?;
        answer
            .recv()
            .map_err(|_| EmbedError::new("the embedding thread has stopped"))?
    }
}
