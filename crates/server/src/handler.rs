use std::sync::Arc;

use manifold_catalog::Principal;
use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler,
    model::{
        CacheScope, CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult,
        PaginatedRequestParams, ServerCapabilities, ServerConfig,
    },
    service::RequestContext,
};

use crate::{
    GatewayState, Mode,
    meta::{self, brokered_call, call_meta, is_meta_tool, meta_tools},
    principal::principal_from_parts,
};

/// How long a client may reuse the meta-tool list: it never changes.
const META_LIST_TTL_MS: u64 = 3_600_000;
/// Direct-mode lists follow the catalog, which changes; keep clients close.
const DIRECT_LIST_TTL_MS: u64 = 30_000;

/// The MCP server a downstream client talks to. One per connection or request;
/// all share the same [`GatewayState`].
#[derive(Clone)]
pub struct Gateway {
    state: Arc<GatewayState>,
    /// Set for stdio, where the process has one caller.
    fixed_principal: Option<Principal>,
}

impl Gateway {
    pub fn new(state: Arc<GatewayState>) -> Self {
        Self {
            state,
            fixed_principal: None,
        }
    }

    pub fn with_fixed_principal(state: Arc<GatewayState>, principal: Principal) -> Self {
        Self {
            state,
            fixed_principal: Some(principal),
        }
    }

    fn principal(&self, context: &RequestContext<RoleServer>) -> Principal {
        if let Some(p) = &self.fixed_principal {
            return p.clone();
        }
        context
            .extensions
            .get::<http::request::Parts>()
            .map(principal_from_parts)
            .unwrap_or_else(Principal::anonymous)
    }

    fn mode(&self) -> Mode {
        self.state.config.mode
    }
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .build();
        let instructions = match self.mode() {
            Mode::Direct => "Manifold gateway: tools from several MCP servers, named server__tool.",
            _ => {
                "Manifold gateway: use search_tools to find tools across many MCP servers, \
                 get_tool_details for a schema, and call_tool to run one."
            }
        };
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("manifold", env!("CARGO_PKG_VERSION")))
            .with_instructions(instructions)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        if self.mode() != Mode::Direct {
            return Ok(ListToolsResult::with_all_items(meta_tools())
                .with_ttl_ms(META_LIST_TTL_MS)
                .with_cache_scope(CacheScope::Public));
        }
        let principal = self.principal(&context);
        let view = self.state.catalog.view(&principal).await;
        let tools = view.tools().map(|t| t.exposed()).collect();
        // What a caller sees may depend on who they are: never shareable.
        Ok(ListToolsResult::with_all_items(tools)
            .with_ttl_ms(DIRECT_LIST_TTL_MS)
            .with_cache_scope(CacheScope::Private))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let principal = self.principal(&context);
        tracing::debug!(principal = %principal.0, has_parts = context.extensions.get::<http::request::Parts>().is_some(), tool = %request.name, "call");
        let args = request.arguments.unwrap_or_default();
        if self.mode() != Mode::Direct && is_meta_tool(&request.name) {
            return Ok(call_meta(&self.state, &principal, &request.name, args).await);
        }
        if self.mode() == Mode::Direct && request.name == meta::CALL_TOOL {
            return Ok(meta::call_tool(&self.state, &principal, args).await);
        }
        Ok(brokered_call(&self.state, &principal, &request.name, Some(args)).await)
    }
}
