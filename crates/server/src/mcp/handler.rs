// Logging (SEP-2577) and resources/subscribe are deprecated, but legacy
// clients still use them and the gateway serves them.
#![allow(deprecated)]

use std::sync::{Arc, Mutex};

use manifold_broker::{Broker, BrokerError, Caller, Refusal, RequestKind};
use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler,
    model::{
        CacheScope, CallToolRequestParams, CallToolResponse, CancelTaskParams,
        CancelledNotificationParam, CompleteRequestParams, CompleteResult, ErrorCode,
        GetPromptRequestParams, GetPromptResponse, GetTaskParams, GetTaskResult, Implementation,
        ListPromptsRequestMethod, ListPromptsResult, ListResourceTemplatesRequestMethod,
        ListResourceTemplatesResult, ListResourcesRequestMethod, ListResourcesResult,
        ListToolsResult, LoggingLevel, PaginatedRequestParams, Prompt, ReadResourceRequestParams,
        ReadResourceResponse, Resource, ResourceTemplate, ServerCapabilities, ServerConfig,
        SetLevelRequestMethod, SetLevelRequestParams, SubscribeRequestParams, SubscriptionFilter,
        Tool, UnsubscribeRequestParams, UpdateTaskParams,
    },
    service::{NotificationContext, RequestContext, SubscriptionContext},
};
use serde_json::json;

use super::{
    call::{brokered_call, direct_call},
    changes::{SessionSubscriptions, accepted_filter},
    forward::{forward_with_rounds, is_modern, upstream_error},
    in_flight::CallOwner,
    meta::{self, call_meta, is_meta_tool, meta_tools_for},
    tasks::task_context,
};
use crate::{GatewayState, Mode};

/// How long a client may reuse the meta-tool list: it never changes.
const META_LIST_TTL_MS: u64 = 3_600_000;
/// Direct-mode lists follow the catalog, which changes; keep clients close.
const DIRECT_LIST_TTL_MS: u64 = 30_000;

/// What one legacy session set: its log level and resource subscriptions.
/// Stateless (2026-07-28) requests each get a fresh one and carry their log
/// level per request.
#[derive(Default)]
struct Session {
    log_level: Mutex<Option<LoggingLevel>>,
    subscriptions: Arc<SessionSubscriptions>,
}

/// The MCP server a downstream client talks to. One per connection or request;
/// all share the same [`GatewayState`].
#[derive(Clone)]
pub struct Gateway {
    state: Arc<GatewayState>,
    /// Set for stdio, where the process has one caller.
    fixed_caller: Option<Caller>,
    session: Arc<Session>,
}

impl Gateway {
    pub fn new(state: Arc<GatewayState>) -> Self {
        Self {
            state,
            fixed_caller: None,
            session: Arc::default(),
        }
    }

    pub fn with_fixed_caller(state: Arc<GatewayState>, caller: Caller) -> Self {
        Self {
            state,
            fixed_caller: Some(caller),
            session: Arc::default(),
        }
    }

    /// The caller the HTTP auth layer resolved (or stdio's only caller).
    /// A request that reached here without one came from a path with no
    /// auth layer; it gets the narrowest identity, never a borrowed one.
    fn caller(&self, context: &RequestContext<RoleServer>) -> Caller {
        self.caller_of(&context.extensions)
    }

    fn caller_of(&self, extensions: &rmcp::model::Extensions) -> Caller {
        if let Some(caller) = &self.fixed_caller {
            return caller.clone();
        }
        extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Caller>())
            .cloned()
            .unwrap_or_else(Caller::anonymous)
    }

    /// Who may cancel this caller's calls: its identity in its MCP
    /// session. rmcp routes a message to a session only with that session's
    /// id, so the header names the session the message arrived in. A stdio
    /// gateway has one peer: its connection is the session.
    fn call_owner(
        &self,
        caller: &Caller,
        extensions: &rmcp::model::Extensions,
    ) -> Option<CallOwner> {
        if self.fixed_caller.is_some() {
            return CallOwner::of(caller, Some("stdio"));
        }
        let session = extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.headers.get("mcp-session-id"))
            .and_then(|value| value.to_str().ok());
        CallOwner::of(caller, session)
    }

    fn mode(&self) -> Mode {
        self.state.config.mode
    }

    fn direct(&self) -> bool {
        self.mode() == Mode::Direct
    }

    /// The guardrails what is relayed during a request passes.
    fn guardrails(&self) -> manifold_broker::guardrails::Guardrails {
        self.state.broker.governance().config().guardrails
    }

    fn session_log_level(&self) -> Option<LoggingLevel> {
        *self
            .session
            .log_level
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Prompts, resources, completions and logging exist only in direct mode,
    /// and only when some upstream has them.
    fn require_direct<M: rmcp::model::ConstString>(&self) -> Result<(), McpError> {
        if self.direct() {
            Ok(())
        } else {
            Err(McpError::method_not_found::<M>())
        }
    }

    /// A direct-mode list of method `M` (prompts, resources or templates):
    /// what `list` lets the caller see.
    async fn list_direct<M: rmcp::model::ConstString, R: DirectList>(
        &self,
        context: &RequestContext<RoleServer>,
        list: impl AsyncFnOnce(&Broker, &Caller) -> Result<Vec<R::Item>, Refusal>,
    ) -> Result<R, McpError> {
        self.require_direct::<M>()?;
        let caller = self.caller(context);
        let items = list(&self.state.broker, &caller).await.map_err(refused)?;
        Ok(R::direct(items))
    }
}

/// The result of a direct-mode list.
trait DirectList {
    type Item;

    /// `items`, fresh for [`DIRECT_LIST_TTL_MS`]. What a caller sees may
    /// depend on who they are: never shareable.
    fn direct(items: Vec<Self::Item>) -> Self;
}

macro_rules! direct_list {
    ($($result:ty => $item:ty),* $(,)?) => {$(
        impl DirectList for $result {
            type Item = $item;

            fn direct(items: Vec<$item>) -> Self {
                <$result>::with_all_items(items)
                    .with_ttl_ms(DIRECT_LIST_TTL_MS)
                    .with_cache_scope(CacheScope::Private)
            }
        }
    )*};
}

direct_list!(
    ListToolsResult => Tool,
    ListPromptsResult => Prompt,
    ListResourcesResult => Resource,
    ListResourceTemplatesResult => ResourceTemplate,
);

/// A governance refusal as a JSON-RPC error, with the structured body a
/// refused tool call carries.
fn refused(refusal: Refusal) -> McpError {
    McpError::invalid_request(refusal.to_string(), Some(refusal.to_json()))
}

/// What the broker said about a prompt, resource or completion.
fn door_error(error: BrokerError) -> McpError {
    match error {
        BrokerError::Refused(refusal) => refused(refusal),
        BrokerError::Unknown {
            what: "resource",
            name,
        } => resource_not_found(&name),
        BrokerError::Unknown { what, name } => McpError::invalid_params(
            format!("Unknown {what} '{name}'"),
            Some(json!({ "name": name })),
        ),
        BrokerError::Upstream(error) => upstream_error(error),
        BrokerError::AuditUnavailable(error) => super::call::audit_unavailable(error),
        other => McpError::internal_error(other.to_string(), None),
    }
}

/// The error for a resource no upstream has; 2026-07-28 peers get it as
/// `-32602` (rmcp maps the code), older ones as `-32002`.
fn resource_not_found(uri: &str) -> McpError {
    McpError::resource_not_found(
        format!("Resource not found: {uri}"),
        Some(json!({ "uri": uri })),
    )
}

fn is_not_found(error: &McpError) -> bool {
    error.code == ErrorCode::RESOURCE_NOT_FOUND || error.code == ErrorCode::INVALID_PARAMS
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        let mut capabilities = json!({ "tools": { "listChanged": true } });
        if self.direct() {
            let broker = &self.state.broker;
            if broker.any_declares(|c| c.prompts.is_some()) {
                capabilities["prompts"] = json!({ "listChanged": true });
            }
            if broker.any_declares(|c| c.resources.is_some()) {
                capabilities["resources"] = json!({ "listChanged": true, "subscribe": true });
            }
            if broker.any_declares(|c| c.completions.is_some()) {
                capabilities["completions"] = json!({});
            }
            if broker.any_declares(|c| c.logging.is_some()) {
                capabilities["logging"] = json!({});
            }
        }
        // Tasks pass through from upstreams that make them.
        capabilities["extensions"] = json!({ "io.modelcontextprotocol/tasks": {} });
        let capabilities: ServerCapabilities =
            serde_json::from_value(capabilities).expect("capabilities literal is valid");
        let instructions = match self.mode() {
            Mode::Direct => {
                "Manifold gateway: tools, prompts and resources from several MCP servers, named server__name."
            }
            _ => {
                "Manifold gateway: use search_tools to find tools across many MCP servers, \
                 get_tool_details for a schema, and call_tool to run one."
            }
        };
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("manifold", env!("CARGO_PKG_VERSION")))
            .with_instructions(instructions)
    }

    async fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        context: NotificationContext<RoleServer>,
    ) {
        if let Some(request) = &notification.request_id {
            let caller = self.caller_of(&context.extensions);
            let owner = self.call_owner(&caller, &context.extensions);
            if self.state.in_flight.cancel(owner, request) {
                tracing::debug!(caller = %caller.name, %request, "call cancelled by the caller");
            }
        }
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.state
            .changes
            .register(context.peer, &self.session.subscriptions);
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        if !self.direct() {
            let code_mode = self.state.code_mode().is_some();
            return Ok(ListToolsResult::with_all_items(meta_tools_for(code_mode))
                .with_ttl_ms(META_LIST_TTL_MS)
                .with_cache_scope(CacheScope::Public));
        }
        let caller = self.caller(&context);
        let visible = self
            .state
            .visible(&caller, Some("list"))
            .await
            .map_err(refused)?;
        let tools = visible
            .view
            .tools()
            .map(|t| {
                let mut tool = t.exposed();
                if visible.needs_approval.contains(&t.qualified) {
                    let mut meta = tool.meta.take().unwrap_or_default();
                    meta.0
                        .insert("manifold/requiresApproval".into(), json!(true));
                    tool.meta = Some(meta);
                }
                tool
            })
            .collect();
        Ok(ListToolsResult::direct(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let caller = self.caller(&context);
        tracing::debug!(caller = %caller.name, tool = %request.name, "call");
        let owner = self.call_owner(&caller, &context.extensions);
        let (explicit_cancel, _in_flight) =
            self.state
                .in_flight
                .register(owner, &context.id, &context.ct);
        let args = request.arguments.unwrap_or_default();
        let name = request.name;
        let state = &self.state;
        let first = (request.input_responses, request.request_state);
        // Every upstream call below goes through the broker; the call context
        // only tells it where progress, logs and questions for this caller go.
        // On the 2026-07-28 wire, closing the stream is the cancellation; on
        // the legacy wire a disconnect is not, only `notifications/cancelled`.
        let cancel = if is_modern(&context) {
            context.ct.clone()
        } else {
            explicit_cancel
        };
        forward_with_rounds(
            &context,
            self.guardrails(),
            self.session_log_level(),
            first,
            |mut call| {
                call.cancel = Some(cancel.clone());
                let caller = &caller;
                let name = &name;
                let args = args.clone();
                async move {
                    if self.direct() && name == meta::CALL_TOOL {
                        return Ok(meta::call_tool(state, caller, args, call).await);
                    }
                    if !self.direct() && is_meta_tool(name) {
                        return Ok(call_meta(state, caller, name, args, call).await);
                    }
                    if self.direct() {
                        direct_call(state, caller, name, Some(args), call).await
                    } else {
                        Ok(brokered_call(state, caller, name, Some(args), call).await)
                    }
                }
            },
        )
        .await
    }

    /// Over HTTP, rmcp checks a call's `Mcp-Param-*` headers against this
    /// schema (SEP-2243), from the listing the catalog already holds.
    fn get_tool(&self, name: &str) -> Option<Tool> {
        if !self.direct() {
            return None;
        }
        let tool = self.state.broker.catalog().cached_tool(name)?;
        Some(tool.exposed())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let caller = self.caller(&context);
        let call = task_context(&context);
        self.state
            .broker
            .get_task(&caller, &request.task_id, &call)
            .await
            .map_err(door_error)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.caller(&context);
        let call = task_context(&context);
        let UpdateTaskParams {
            task_id,
            input_responses,
            ..
        } = request;
        self.state
            .broker
            .update_task(&caller, &task_id, input_responses, &call)
            .await
            .map_err(door_error)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.caller(&context);
        let call = task_context(&context);
        self.state
            .broker
            .cancel_task(&caller, &request.task_id, &call)
            .await
            .map_err(door_error)
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        self.list_direct::<ListPromptsRequestMethod, _>(&context, Broker::list_prompts)
            .await
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        self.require_direct::<rmcp::model::GetPromptRequestMethod>()?;
        let caller = self.caller(&context);
        let broker = &self.state.broker;
        let allowed = broker
            .allow_prompt(&caller, &request.name, request.arguments.as_ref())
            .await
            .map_err(door_error)?;
        let first = (
            request.input_responses.clone(),
            request.request_state.clone(),
        );
        forward_with_rounds(
            &context,
            self.guardrails(),
            self.session_log_level(),
            first,
            |call| {
                let mut params = request.clone();
                params.input_responses = call.input_responses.clone();
                params.request_state = call.request_state.clone();
                let (allowed, caller) = (&allowed, &caller);
                async move {
                    broker
                        .get_prompt(caller, allowed, params, &call)
                        .await
                        .map_err(door_error)
                }
            },
        )
        .await
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        self.list_direct::<ListResourcesRequestMethod, _>(&context, Broker::list_resources)
            .await
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        self.list_direct::<ListResourceTemplatesRequestMethod, _>(
            &context,
            Broker::list_resource_templates,
        )
        .await
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        self.require_direct::<rmcp::model::ReadResourceRequestMethod>()?;
        let caller = self.caller(&context);
        let broker = &self.state.broker;
        let allowed = broker
            .allow_read(&caller, &request.uri)
            .await
            .map_err(door_error)?;
        let mut last_error = None;
        for attempt in 0..allowed.targets() {
            let first = (
                request.input_responses.clone(),
                request.request_state.clone(),
            );
            let result = forward_with_rounds(
                &context,
                self.guardrails(),
                self.session_log_level(),
                first,
                |call| {
                    let mut params = request.clone();
                    params.input_responses = call.input_responses.clone();
                    params.request_state = call.request_state.clone();
                    let (allowed, caller) = (&allowed, &caller);
                    async move {
                        broker
                            .read_resource(caller, allowed, attempt, params, &call)
                            .await
                            .map_err(door_error)
                    }
                },
            )
            .await;
            match result {
                // Another server may have it (e.g. under a matching template).
                Err(error) if is_not_found(&error) && attempt + 1 < allowed.targets() => {
                    last_error = Some(error);
                }
                other => return other,
            }
        }
        Err(last_error.unwrap_or_else(|| resource_not_found(&request.uri)))
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        self.require_direct::<rmcp::model::CompleteRequestMethod>()?;
        let caller = self.caller(&context);
        let allowed = self
            .state
            .broker
            .allow_completion(&caller, &request.r#ref)
            .await
            .map_err(door_error)?;
        let call = manifold_upstream::CallContext {
            client_capabilities: context.client_capabilities(),
            ..Default::default()
        };
        self.state
            .broker
            .complete(&caller, &allowed, request, &call)
            .await
            .map_err(door_error)
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        // 2026-07-28 removed logging/setLevel for a per-request level.
        if is_modern(&context) || !self.direct() {
            return Err(McpError::method_not_found::<SetLevelRequestMethod>());
        }
        // The level is this session's own: the gateway filters what upstreams
        // log by it, and no caller sets an upstream's level for everyone.
        *self
            .session
            .log_level
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(request.level);
        Ok(())
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.require_direct::<rmcp::model::SubscribeRequestMethod>()?;
        let caller = self.caller(&context);
        let broker = &self.state.broker;
        let allowed = broker
            .allow_subscription(&caller, RequestKind::ResourcesSubscribe, &request.uri)
            .await
            .map_err(door_error)?;
        self.session.subscriptions.insert(&request.uri);
        // Legacy upstreams that support it send `resources/updated`, which
        // reaches every session subscribed to the URI.
        broker
            .subscribe(&allowed, &request.uri)
            .await
            .map_err(upstream_error)?;
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.require_direct::<rmcp::model::UnsubscribeRequestMethod>()?;
        let caller = self.caller(&context);
        self.state
            .broker
            .allow_subscription(&caller, RequestKind::ResourcesUnsubscribe, &request.uri)
            .await
            .map_err(door_error)?;
        self.session.subscriptions.remove(&request.uri);
        Ok(())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        // The progressive tools array never changes; nothing to announce there.
        let direct = self.direct();
        Some(accepted_filter(requested, direct, direct, direct))
    }

    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), McpError> {
        // A resource subscription follows the resource. rmcp acknowledges
        // the stream before this runs, so a refused URI is dropped here
        // (and audited): its updates are never sent.
        let caller = self.caller(subscription.request_context());
        let mut readable = Vec::new();
        for uri in subscription
            .accepted()
            .resource_subscriptions
            .iter()
            .flatten()
        {
            let allowed = self
                .state
                .broker
                .allow_subscription(&caller, RequestKind::ResourcesSubscribe, uri)
                .await;
            if allowed.is_ok() {
                readable.push(uri.clone());
            }
        }
        self.state.changes.follow(subscription, readable).await
    }
}
