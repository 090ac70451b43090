//! Connections to upstream MCP servers.
//!
//! One [`Upstream`] per configured server: it owns the rmcp client, speaks both
//! protocol eras, pages through `tools/list` (and prompts, resources and
//! resource templates) with guards, caps concurrent calls, forwards requests on
//! behalf of downstream callers with their progress, logs and server-to-client
//! requests relayed back ([`relay`]), and supervises the connection (restart
//! with backoff after a crash).
//!
//! `connection/` holds [`Upstream`] by job (opening, supervision, forwarding,
//! per-principal connections, rmcp's client handler); `plain/` the plain
//! `tools/call` POST to a stateless HTTP upstream, rmcp's shadow on the
//! call path (switch: [`UpstreamConfig::plain_calls`]); `sse` the legacy HTTP+SSE client transport; `listing` the paging
//! guards; `oauth` the gateway's sign-ins at upstreams.

pub mod address;
mod config;
mod connection;
mod listing;
pub mod oauth;
mod plain;
pub mod relay;
mod sse;
mod trace;

pub use config::{
    Credentials, DEFAULT_INHERITED_ENV, HttpTransport, ServerOrigin, ToolOverride, UpstreamAuth,
    UpstreamConfig, expand_env,
};
pub use connection::{Era, LastError, Upstream, UpstreamState, UpstreamStatus, era_of};
pub use listing::{
    CacheScope, Listing, PromptListing, ResourceListing, ResourceTemplateListing, ToolListing,
    list_tools_from_pages,
};
pub use relay::{CallContext, Relay};
pub use trace::join_caller_trace;

/// What the catalog needs to hear from an upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamEvent {
    /// The tool list changed (a `list_changed` notification, or a reconnect).
    ToolsChanged { server: String },
    /// The prompt list changed.
    PromptsChanged { server: String },
    /// The resource or resource-template list changed.
    ResourcesChanged { server: String },
    /// A subscribed resource changed (legacy `notifications/resources/updated`).
    ResourceUpdated { server: String, uri: String },
    /// The connection state changed.
    StateChanged { server: String },
}

/// How many bytes `value` takes as JSON, counted as it is written rather
/// than by building the text: a result's size is checked on every call.
pub fn json_len<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).map_or(0, |()| count.0)
}

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
    /// The upstream answered with a JSON-RPC error. Surfaces that forward on
    /// behalf of a client pass `error` through unchanged.
    #[error("server '{server}' returned error {}: {}", error.code.0, error.message)]
    Rpc {
        server: String,
        error: rmcp::ErrorData,
    },
    #[error(
        "server '{server}' returned a result too large to pass on: {:.1} MB, over the {:.1} MB limit (max_result_bytes)",
        *bytes as f64 / 1_048_576.0, *limit as f64 / 1_048_576.0
    )]
    ResultTooLarge {
        server: String,
        bytes: usize,
        limit: usize,
    },
    #[error("server '{server}' is disabled")]
    Disabled { server: String },
    /// An `oauth` server refused the gateway's token and no refresh helped.
    #[error("auth_required: server '{server}' {hint}")]
    AuthRequired { server: String, hint: String },
    #[error("the caller cancelled the request to server '{server}'")]
    Cancelled { server: String },
}
