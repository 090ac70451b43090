//! The surfaces for model providers and their hosts: the caller's catalog
//! in the Anthropic and OpenAI shapes (`export`), served over HTTP with
//! search and call (`api`); and the callback that finishes an upstream's
//! OAuth sign-in (`oauth_callback`).

pub(crate) mod api;
pub mod export;
pub(crate) mod oauth_callback;
