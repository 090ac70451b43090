//! The embedding crate's tests, one binary: the cache, the local model, the
//! OpenAI-compatible endpoint and the reranker.

mod cache;
mod minilm;
mod openai;
mod rerank;
