//! The broker: the one path from any surface to an upstream `tools/call`.
//!
//! Every caller (the `call_tool` meta-tool, direct-mode calls, code mode, the
//! admin API) goes through [`Broker::call`]. Today it resolves the tool in the
//! caller's view, validates the arguments against the tool's `inputSchema`,
//! and forwards under the server's timeout and concurrency cap, tracing each
//! call. Policy, approvals, rate limits and audit are layers on this same path.

mod validate;

use std::{sync::Arc, time::Instant};

use manifold_catalog::{CatalogView, Principal, ToolCatalog};
use manifold_upstream::UpstreamError;
use rmcp::model::{CallToolResponse, JsonObject};

pub use validate::ArgumentValidator;

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("unknown tool '{name}'")]
    UnknownTool { name: String },
    #[error("invalid arguments for '{tool}': {}", violations.join("; "))]
    InvalidArguments {
        tool: String,
        violations: Vec<String>,
    },
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
}

/// One call as a surface hands it to the broker.
pub struct CallRequest<'a> {
    pub principal: &'a Principal,
    /// The qualified name the caller used.
    pub tool: &'a str,
    pub arguments: Option<JsonObject>,
}

pub struct Broker {
    catalog: Arc<ToolCatalog>,
    validator: ArgumentValidator,
}

impl Broker {
    pub fn new(catalog: Arc<ToolCatalog>) -> Arc<Self> {
        Arc::new(Self {
            catalog,
            validator: ArgumentValidator::default(),
        })
    }

    pub fn catalog(&self) -> &Arc<ToolCatalog> {
        &self.catalog
    }

    /// Resolve, validate and forward one call.
    pub async fn call(&self, request: CallRequest<'_>) -> Result<CallToolResponse, BrokerError> {
        let view = self.catalog.view(request.principal).await;
        self.call_in_view(&view, request).await
    }

    /// Like [`Broker::call`], reusing a view the surface already holds.
    pub async fn call_in_view(
        &self,
        view: &CatalogView,
        request: CallRequest<'_>,
    ) -> Result<CallToolResponse, BrokerError> {
        let started = Instant::now();
        let tool = view
            .tool(request.tool)
            .ok_or_else(|| BrokerError::UnknownTool {
                name: request.tool.to_string(),
            })?;
        let span = tracing::info_span!("broker.call", server = %tool.server, tool = %tool.upstream_name, principal = %request.principal.0);
        let _enter = span.enter();
        let arguments = request.arguments.unwrap_or_default();
        let violations = self.validator.check(tool, &arguments);
        if !violations.is_empty() {
            tracing::debug!(outcome = "invalid_arguments", "call refused");
            return Err(BrokerError::InvalidArguments {
                tool: tool.qualified.clone(),
                violations,
            });
        }
        let upstream =
            self.catalog
                .upstream(&tool.server)
                .ok_or_else(|| UpstreamError::NotConnected {
                    server: tool.server.clone(),
                })?;
        drop(_enter);
        let result = upstream
            .call_tool(&tool.upstream_name, Some(arguments))
            .await;
        let _enter = span.enter();
        let outcome = match &result {
            Ok(CallToolResponse::Complete(r)) if r.is_error == Some(true) => "tool_error",
            Ok(_) => "ok",
            Err(_) => "upstream_error",
        };
        tracing::debug!(
            outcome,
            elapsed_us = started.elapsed().as_micros() as u64,
            "call finished"
        );
        Ok(result?)
    }
}
