//! The surfaces for model providers and their hosts: the caller's catalog
//! in the Anthropic and OpenAI shapes (`export`), served over HTTP with
//! search and call (`api`); and an upstream's OAuth sign-in: the page where
//! a caller's own sign-in starts (`sign_in`) and the callback that finishes
//! every sign-in (`oauth_callback`).

pub(crate) mod api;
pub mod export;
pub(crate) mod oauth_callback;
pub(crate) mod sign_in;
