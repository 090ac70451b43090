//! The HTTP server: its loop (`listen`), the router of every surface, and
//! `/mcp` as one pipeline of plain functions (`pipeline`): the guard, who
//! is calling (`auth`, `principal`), the body read once and tracked
//! (`requests`), admission of discovery, and the fast call; then rmcp.
//! `sse` serves legacy HTTP+SSE clients through the same steps. `health`
//! holds the probes, which skip the guard's `Host` check.

pub(crate) mod admission;
pub(crate) mod auth;
mod fast_call;
pub(crate) mod guard;
mod health;
pub mod listen;
mod pipeline;
pub(crate) mod principal;
pub(crate) mod requests;
mod router;
pub mod sse;

pub use router::router;
