//! The `[search.embedding]` section of the gateway config.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use manifold_search::{EmbedError, Embedder};
use serde::Deserialize;

use crate::{
    CachedEmbedder, ChatApi, ChatReranker, GENERIC_MODEL, MODEL_DIR_ENV, MiniLm, OpenAiEmbedder,
    TOOL_MODEL, resolve_generic_model_dir, resolve_model_dir,
};

/// Which model embeds tools and queries, and where vectors are cached.
///
/// ```toml
/// [search.embedding]
/// enabled = true                               # false: bm25 only, no model loaded
/// model = "tool-minilm-l6"                     # the default; "all-MiniLM-L6-v2" is the generic one
/// model_dir = "/opt/models/all-MiniLM-L6-v2"   # default: see resolve_model_dir
/// # or an OpenAI-compatible endpoint instead of the local model:
/// url = "http://127.0.0.1:8000/v1/embeddings"
/// model = "all-MiniLM-L6-v2"
/// api_key_env = "EMBEDDINGS_API_KEY"
/// cache_dir = "/var/cache/manifold/embeddings"  # default: ~/.cache/manifold/embeddings
/// ```
///
/// Relative paths are taken as given: the caller resolves them against the
/// config's folder.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingConfig {
    /// Load a model at all (default true). Off, or when no model can be
    /// loaded, the gateway searches with BM25F only and says so in its log.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Directory of a local model in the all-MiniLM-L6-v2 layout.
    #[serde(default)]
    pub model_dir: Option<PathBuf>,
    /// An OpenAI-compatible `/v1/embeddings` URL, used instead of the local
    /// model.
    #[serde(default)]
    pub url: Option<String>,
    /// The model name sent to `url`; without `url`, the local model:
    /// `tool-minilm-l6` (the default) or `all-MiniLM-L6-v2` (the generic one).
    #[serde(default)]
    pub model: Option<String>,
    /// Name of the environment variable that holds `url`'s API key (the key
    /// itself never goes in the config).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Timeout of one request to `url`, in milliseconds (default 10,000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Where tool vectors are cached.
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
}

/// The model name sent to an endpoint when the config names none.
pub const DEFAULT_REMOTE_MODEL: &str = "all-MiniLM-L6-v2";

impl EmbeddingConfig {
    /// Whether a model should be loaded (`enabled`, default true).
    pub fn is_enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }

    /// A short description of the configured model for log lines: the
    /// endpoint's URL and model, or the local model's directory setting.
    pub fn describe(&self) -> String {
        match &self.url {
            Some(url) => format!(
                "{} at {url}",
                self.model.as_deref().unwrap_or(DEFAULT_REMOTE_MODEL)
            ),
            None => format!("{} (local)", self.model.as_deref().unwrap_or(TOOL_MODEL)),
        }
    }

    /// The configured model, uncached: the endpoint when `url` is set, else
    /// the local model (found as [`resolve_model_dir`] says, from
    /// `search_from`). Loading the local model takes about 0.1–0.3 s.
    pub fn embedder(&self, search_from: &[PathBuf]) -> Result<Arc<dyn Embedder>, EmbedError> {
        if let Some(url) = &self.url {
            let api_key = match &self.api_key_env {
                Some(var) => Some(std::env::var(var).map_err(|_| {
                    EmbedError(format!(
                        "search.embedding.api_key_env names {var}, which is not set"
                    ))
                })?),
                None => None,
            };
            let model = self.model.as_deref().unwrap_or(DEFAULT_REMOTE_MODEL);
            let timeout = Duration::from_millis(self.timeout_ms.unwrap_or(10_000));
            return Ok(Arc::new(OpenAiEmbedder::new(url, model, api_key, timeout)?));
        }
        Ok(Arc::new(MiniLm::load(&self.local_model_dir(search_from)?)?))
    }

    /// The local model's folder: an explicit `model_dir` (or
    /// `MANIFOLD_EMBEDDING_MODEL_DIR`) wins, else the model `model` names.
    fn local_model_dir(&self, search_from: &[PathBuf]) -> Result<PathBuf, EmbedError> {
        let explicit = self.model_dir.is_some() || std::env::var_os(MODEL_DIR_ENV).is_some();
        match self.model.as_deref() {
            None | Some(TOOL_MODEL) => resolve_model_dir(self.model_dir.as_deref(), search_from),
            Some(GENERIC_MODEL) if !explicit => resolve_generic_model_dir(search_from),
            Some(GENERIC_MODEL) => resolve_model_dir(self.model_dir.as_deref(), search_from),
            Some(other) => Err(EmbedError(format!(
                "search.embedding.model = {other:?} is no local model: use {TOOL_MODEL:?} (the \
                 default) or {GENERIC_MODEL:?}, or set search.embedding.url for an endpoint"
            ))),
        }
    }

    /// [`EmbeddingConfig::embedder`] behind the vector cache in `cache_dir`
    /// (or [`default_cache_dir`]).
    pub fn open(&self, search_from: &[PathBuf]) -> Result<Arc<CachedEmbedder>, EmbedError> {
        let inner = self.embedder(search_from)?;
        let dir = self.cache_dir.clone().unwrap_or_else(default_cache_dir);
        Ok(Arc::new(CachedEmbedder::new(inner, &dir)?))
    }
}

/// The `[search.rerank]` section: the optional `rerank` strategy.
///
/// ```toml
/// [search.rerank]
/// url = "http://127.0.0.1:8000/v1/chat/completions"
/// model = "a-small-chat-model"
/// api = "openai"               # or "anthropic" (/v1/messages)
/// api_key_env = "RERANK_API_KEY"
/// timeout_ms = 2000            # slower: the hybrid ranking is used
/// top_k = 20                   # how many hybrid results are re-ordered
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RerankConfig {
    pub url: String,
    pub model: String,
    #[serde(default)]
    pub api: ChatApi,
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub top_k: Option<usize>,
}

impl RerankConfig {
    /// The configured reranker (no request is made yet).
    pub fn reranker(&self) -> Result<Arc<ChatReranker>, EmbedError> {
        let api_key = match &self.api_key_env {
            Some(var) => Some(std::env::var(var).map_err(|_| {
                EmbedError(format!(
                    "search.rerank.api_key_env names {var}, which is not set"
                ))
            })?),
            None => None,
        };
        Ok(Arc::new(ChatReranker::new(
            &self.url,
            &self.model,
            self.api,
            api_key,
            Duration::from_millis(self.timeout_ms.unwrap_or(2_000)),
            self.top_k.unwrap_or(20),
        )?))
    }
}

/// `$XDG_CACHE_HOME/manifold/embeddings`, else `~/.cache/manifold/embeddings`,
/// else `manifold-embeddings` in the temporary directory.
pub fn default_cache_dir() -> PathBuf {
    let env_dir = |var: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env_dir("XDG_CACHE_HOME")
        .or_else(|| env_dir("HOME").map(|h| h.join(".cache")))
        .map(|base| base.join("manifold").join("embeddings"))
        .unwrap_or_else(|| std::env::temp_dir().join("manifold-embeddings"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_section() {
        let config: EmbeddingConfig = toml::from_str(
            r#"
enabled = true
model_dir = "/opt/models/all-MiniLM-L6-v2"
url = "http://127.0.0.1:8000/v1/embeddings"
model = "all-MiniLM-L6-v2"
api_key_env = "EMBEDDINGS_API_KEY"
timeout_ms = 2000
cache_dir = "/var/cache/manifold/embeddings"
"#,
        )
        .unwrap();
        assert_eq!(config.timeout_ms, Some(2000));
        assert!(toml::from_str::<EmbeddingConfig>("modle_dir = \"x\"").is_err());
    }
}
