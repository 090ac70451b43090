//! The MCP server a downstream client talks to: the rmcp handler
//! (`handler`), forwarding a request upstream with what the upstream sends
//! back on the way (`forward`), a tool call through the broker (`call`),
//! the meta-tools of progressive mode (`meta`) and their search
//! (`discovery`), list changes (`changes`), legacy calls in flight
//! (`in_flight`), the mode (`mode`), code mode's results (`code`) and the
//! tasks extension (`tasks`).

pub(crate) mod call;
pub(crate) mod changes;
mod code;
pub(crate) mod discovery;
mod forward;
mod handler;
pub(crate) mod in_flight;
pub(crate) mod meta;
pub(crate) mod mode;
#[cfg(test)]
mod request_kinds;
mod tasks;

pub use handler::Gateway;
