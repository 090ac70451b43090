//! A tool call through the broker, as the MCP surface answers it: the
//! upstream's answer passes through, and what the gateway itself refuses
//! (an unknown tool, a governance refusal) is a tool error the model can
//! read. Direct mode's `tools/call` (and its fast path,
//! `http/fast_call.rs`), progressive mode's tools and the provider API's
//! `POST /call` all call here.

use std::sync::Arc;

use manifold_broker::{BrokerError, CallRequest, Caller};
use manifold_catalog::CatalogView;
use manifold_upstream::CallContext;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock as Content, JsonObject};

use crate::GatewayState;

/// A tool-level error the model can read and act on.
pub(crate) fn error_result(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![Content::text(message.into())])
}

pub(crate) fn unknown_tool_message(name: &str, suggestions: &[String]) -> String {
    // A 4 MiB name is not echoed back whole: as the audit keeps it.
    let cut = manifold_store::cut_text(name, manifold_store::MAX_STORED_NAME_BYTES);
    let name = if cut.len() < name.len() {
        format!("{cut}… ({} bytes)", name.len())
    } else {
        name.to_string()
    };
    if suggestions.is_empty() {
        format!("Unknown tool '{name}'. Use search_tools to find tools.")
    } else {
        format!(
            "Unknown tool '{name}'. Did you mean: {}?",
            suggestions.join(", ")
        )
    }
}

/// A call refused (or its answer withheld) because its audit row cannot be
/// made durable: a JSON-RPC error, not a tool result the model might retry
/// as if the tool had failed.
pub(crate) fn audit_unavailable(error: manifold_broker::AuditUnavailable) -> rmcp::ErrorData {
    rmcp::ErrorData::internal_error(
        error.to_string(),
        Some(serde_json::json!({ "code": manifold_broker::AuditUnavailable::CODE })),
    )
}

pub(crate) fn as_tool_error(name: &str, error: rmcp::ErrorData) -> CallToolResponse {
    CallToolResponse::Complete(error_result(format!(
        "{name} failed: {} (error {})",
        error.message, error.code.0
    )))
}

/// Forward a call through the broker for the model: every failure, an
/// upstream JSON-RPC error included, becomes a tool error the model can read.
pub(crate) async fn brokered_call(
    state: &GatewayState,
    caller: &Caller,
    name: &str,
    arguments: Option<JsonObject>,
    context: CallContext,
) -> CallToolResponse {
    direct_call(state, caller, name, arguments, context)
        .await
        .unwrap_or_else(|error| as_tool_error(name, error))
}

/// Forward a direct-mode `tools/call` through the broker: the upstream's
/// answer passes through unchanged, a JSON-RPC error (such as a missing
/// client capability or a rejected `requestState`) included. What the
/// gateway itself refuses is a tool error.
pub(crate) async fn direct_call(
    state: &GatewayState,
    caller: &Caller,
    name: &str,
    arguments: Option<JsonObject>,
    context: CallContext,
) -> Result<CallToolResponse, rmcp::ErrorData> {
    let view = state.catalog.view_for_call(&caller.principal, name).await;
    call_in_view(state, view, caller, name, arguments, context).await
}

/// [`direct_call`] in the one catalog view this request uses.
pub(crate) async fn call_in_view(
    state: &GatewayState,
    view: Arc<CatalogView>,
    caller: &Caller,
    name: &str,
    arguments: Option<JsonObject>,
    context: CallContext,
) -> Result<CallToolResponse, rmcp::ErrorData> {
    let request = CallRequest {
        caller,
        tool: name,
        arguments,
        approval_id: None,
        provenance: None,
        context,
    };
    match state.broker.call_in_view(&view, request).await {
        Ok(response) => Ok(response),
        Err(BrokerError::UnknownTool { name }) => {
            // Not audited again: the broker recorded the unknown tool.
            let suggestions = match state.governance().visible(caller, &view, None).await {
                Ok(visible) => state.discovery.suggest(&visible.view, &name),
                Err(_) => Vec::new(),
            };
            Ok(CallToolResponse::Complete(error_result(
                unknown_tool_message(&name, &suggestions),
            )))
        }
        Err(BrokerError::Refused(refusal)) => Ok(CallToolResponse::Complete(
            CallToolResult::structured_error(refusal.to_json()),
        )),
        Err(BrokerError::Upstream(manifold_upstream::UpstreamError::Rpc { error, .. })) => {
            Err(error)
        }
        Err(BrokerError::AuditUnavailable(error)) => Err(audit_unavailable(error)),
        Err(e) => Ok(CallToolResponse::Complete(error_result(e.to_string()))),
    }
}
