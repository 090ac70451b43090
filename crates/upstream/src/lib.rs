//! Connections to upstream MCP servers.
//!
//! One [`Upstream`] per configured server: it owns the rmcp client, speaks both
//! protocol eras, pages through `tools/list` with guards, caps concurrent calls,
//! and supervises the connection (restart with backoff after a crash).

mod config;
mod connection;
mod listing;

pub use config::{UpstreamConfig, expand_env};
pub use connection::{Era, Upstream, UpstreamEvent, UpstreamState, UpstreamStatus};
pub use listing::{CacheScope, ToolListing};

/// Why an upstream operation failed. Messages are shown to operators and models,
/// so they never include secrets.
#[derive(Debug, thiserror::Error, Clone)]
pub enum UpstreamError {
    #[error("server '{server}' is not connected")]
    NotConnected { server: String },
    #[error("server '{server}' failed to connect: {reason}")]
    Connect { server: String, reason: String },
    #[error("server '{server}' did not answer {operation} within {timeout_ms} ms")]
    Timeout {
        server: String,
        operation: &'static str,
        timeout_ms: u64,
    },
    #[error(
        "server '{server}' repeated pagination cursor {cursor:?} on page {page}; listing cut off"
    )]
    CursorLoop {
        server: String,
        cursor: String,
        page: usize,
    },
    #[error("server '{server}' exceeded the page cap of {max_pages} pages; listing cut off")]
    TooManyPages { server: String, max_pages: usize },
    #[error("server '{server}': {message}")]
    Protocol { server: String, message: String },
    #[error("server '{server}' is disabled")]
    Disabled { server: String },
}
