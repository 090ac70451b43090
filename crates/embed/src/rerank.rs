//! The `rerank` strategy's model: an OpenAI- or Anthropic-compatible chat
//! endpoint asked to order the `hybrid` strategy's best tools.
//!
//! Like [`crate::OpenAiEmbedder`], requests run on a thread of their own
//! ([`crate::http_thread`]), so the synchronous [`Reranker`] can be called
//! from plain threads and from inside another runtime. Every request is
//! bounded by the configured timeout; a slow, failing or unparseable answer
//! is an error, logged here, on which the search falls back to `hybrid`.

use std::time::Duration;

use manifold_search::{EmbedError, Reranker, ToolDoc};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::http_thread::{HttpThread, client, parse_url};

/// Which chat API the endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChatApi {
    /// `POST /v1/chat/completions`: `choices[0].message.content`.
    #[default]
    OpenAi,
    /// `POST /v1/messages`: `content[0].text`.
    Anthropic,
}

/// Asks a chat model to order candidate tools; see the module docs.
pub struct ChatReranker {
    requests: HttpThread<String, String>,
    top_k: usize,
}

impl ChatReranker {
    /// `url` is the full endpoint; `api_key`, when given, goes as a bearer
    /// token (OpenAI) or `x-api-key` (Anthropic). `timeout` bounds each
    /// request from connect to last byte.
    pub fn new(
        url: &str,
        model: &str,
        api: ChatApi,
        api_key: Option<String>,
        timeout: Duration,
        top_k: usize,
    ) -> Result<Self, EmbedError> {
        let chat = Chat {
            url: parse_url("rerank", url)?,
            client: client(timeout)?,
            model: model.to_string(),
            api,
            api_key,
        };
        let requests = HttpThread::start(
            "rerank",
            "manifold-rerank-http",
            async move |prompt: String| chat.ask(prompt).await,
        )?;
        Ok(Self {
            requests,
            top_k: top_k.max(2),
        })
    }
}

/// The question put to the model.
fn prompt(query: &str, candidates: &[&ToolDoc]) -> String {
    let mut text = format!("A user needs tools for this task:\n{query}\n\nCandidate tools:\n");
    for (i, doc) in candidates.iter().enumerate() {
        let description: String = doc.description.chars().take(300).collect();
        text.push_str(&format!(
            "[{i}] {} ({}): {}\n",
            doc.name,
            doc.server,
            description.replace('\n', " ")
        ));
    }
    text.push_str(
        "\nList the numbers of the useful tools, most useful first, separated by commas. \
         Answer with the numbers only.",
    );
    text
}

/// The numbers in the model's answer, in order.
fn parse_order(answer: &str) -> Vec<usize> {
    answer
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect()
}

struct Chat {
    client: reqwest::Client,
    url: reqwest::Url,
    model: String,
    api: ChatApi,
    api_key: Option<String>,
}

impl Chat {
    async fn ask(&self, prompt: String) -> Result<String, EmbedError> {
        let message = json!([{ "role": "user", "content": prompt }]);
        let mut request = self.client.post(self.url.clone());
        request = match self.api {
            ChatApi::OpenAi => {
                let r = request.json(&json!({
                    "model": self.model, "messages": message, "temperature": 0, "max_tokens": 200
                }));
                match &self.api_key {
                    Some(key) => r.bearer_auth(key),
                    None => r,
                }
            }
            ChatApi::Anthropic => {
                let r = request
                    .header("anthropic-version", "2023-06-01")
                    .json(&json!({
                        "model": self.model, "messages": message, "temperature": 0, "max_tokens": 200
                    }));
                match &self.api_key {
                    Some(key) => r.header("x-api-key", key),
                    None => r,
                }
            }
        };
        let fail = |e: reqwest::Error| EmbedError(format!("rerank endpoint: {e}"));
        let response = request.send().await.map_err(fail)?;
        let status = response.status();
        if !status.is_success() {
            return Err(EmbedError(format!("rerank endpoint answered {status}")));
        }
        let body: Value = response.json().await.map_err(fail)?;
        let text = match self.api {
            ChatApi::OpenAi => body["choices"][0]["message"]["content"].as_str(),
            ChatApi::Anthropic => body["content"][0]["text"].as_str(),
        };
        text.map(str::to_string)
            .ok_or_else(|| EmbedError::new("rerank endpoint: no text in the answer"))
    }
}

impl Reranker for ChatReranker {
    fn top_k(&self) -> usize {
        self.top_k
    }

    fn rerank(&self, query: &str, candidates: &[&ToolDoc]) -> Result<Vec<usize>, EmbedError> {
        let result = self
            .requests
            .ask(prompt(query, candidates))
            .and_then(|text| {
                let order = parse_order(&text);
                if order.iter().any(|&i| i < candidates.len()) {
                    Ok(order)
                } else {
                    Err(EmbedError(format!(
                        "rerank endpoint: no candidate number in {:?}",
                        text.chars().take(100).collect::<String>()
                    )))
                }
            });
        if let Err(e) = &result {
            tracing::warn!(error = %e, "search: rerank failed; using the hybrid ranking");
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::parse_order;

    #[test]
    fn reads_numbers_in_order() {
        assert_eq!(parse_order("2, 0, 5"), [2, 0, 5]);
        assert_eq!(parse_order("[3] then [1]."), [3, 1]);
        assert!(parse_order("none").is_empty());
    }
}
