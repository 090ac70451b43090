//! An OpenAI-compatible `/v1/embeddings` endpoint as an [`Embedder`],
//! called from the embedder's own thread ([`crate::http_thread`]).

use std::time::Duration;

use manifold_search::{EmbedError, Embedder};
use serde::Deserialize;
use serde_json::json;

use crate::http_thread::{HttpThread, client, parse_url};

/// Texts per request.
const BATCH: usize = 128;

/// Calls `POST {url}` with `{"model", "input": [texts]}` and reads
/// `data[].embedding` (ordered by `data[].index`).
pub struct OpenAiEmbedder {
    requests: HttpThread<Vec<String>, Vec<Vec<f32>>>,
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
        let parsed = parse_url("embedding", url)?;
        let endpoint = Endpoint {
            client: client(timeout)?,
            url: parsed.clone(),
            model: model.to_string(),
            api_key,
        };
        let requests = HttpThread::start(
            "embedding",
            "manifold-embed-http",
            async move |texts: Vec<String>| endpoint.embed(texts).await,
        )?;
        // The id names the endpoint without credentials or query string.
        let mut shown = parsed;
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        shown.set_query(None);
        Ok(Self {
            requests,
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
        self.requests
            .ask(texts.iter().map(|t| t.to_string()).collect())
    }
}
