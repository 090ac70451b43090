//! The tasks extension (`io.modelcontextprotocol/tasks`) on the MCP
//! surface: what a `tasks/*` request carries upstream. The broker decides
//! and forwards each one (`broker/src/tasks.rs`); rmcp has already refused
//! a request that did not declare the extension (`-32021`) and, over HTTP,
//! one whose `Mcp-Name` does not name its task (`-32020`).

use manifold_upstream::CallContext;
use rmcp::{RoleServer, service::RequestContext};

/// The context a `tasks/*` request goes upstream with: the caller's
/// declared capabilities, so the upstream sees the same declaration that
/// made the task.
pub(crate) fn task_context(context: &RequestContext<RoleServer>) -> CallContext {
    CallContext {
        client_capabilities: Some(context.client_capabilities().unwrap_or_default()),
        ..CallContext::default()
    }
}
