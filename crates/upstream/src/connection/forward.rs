//! Requests to an upstream on behalf of downstream callers (`tools/call`,
//! `prompts/get`, `resources/read`, `completion/complete`, subscriptions)
//! and the listings the catalog pages through.
//!
//! A request goes over the server's own connection, or on a per-principal
//! server over the caller's. A call's future is boxed by its callers, so its
//! size is paid on every call: rare branches are boxed here, where the
//! futures are awaited, and nothing else on the path holds a copy.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use futures::future::Either;
use rmcp::{
    RoleClient, ServiceError,
    model::{
        CallToolRequest, CallToolRequestParams, CallToolResponse, CancelledNotificationParam,
        ClientRequest, CompleteRequest, CompleteRequestParams, CompleteResult, GetPromptRequest,
        GetPromptRequestParams, GetPromptResponse, JsonObject, PaginatedRequestParams,
        ReadResourceRequest, ReadResourceRequestParams, ReadResourceResponse, RequestId,
        RequestMetaObject, ServerResult, SubscribeRequestParams, UnsubscribeRequestParams,
    },
    service::{Peer, PeerRequestOptions},
};

use super::{
    Upstream,
    open::{Connected, Connection, Era},
    principals::Principals,
};
use crate::{
    CallContext, Listing, PromptListing, ResourceListing, ResourceTemplateListing, ToolListing,
    UpstreamError,
    listing::{Page, list_all},
};

impl Upstream {
    /// Forward one `tools/call`, holding a concurrency permit, within
    /// `call_timeout_ms`, with the caller's context: request `_meta`, relay,
    /// and the MRTR `inputResponses`/`requestState` of a retry.
    pub async fn call_tool_with(
        &self,
        tool: &str,
        arguments: Option<JsonObject>,
        context: &CallContext,
    ) -> Result<CallToolResponse, UpstreamError> {
        if let Some(openapi) = &self.openapi {
            // Boxed: a rare branch, kept out of every MCP call's future.
            let result = Box::pin(openapi.call(&self.connection, tool, arguments)).await?;
            if let Some(error) = self.result_too_large("tools/call", &result) {
                return Err(error);
            }
            return Ok(CallToolResponse::Complete(result));
        }
        // In a block: `params` would otherwise keep its place in this
        // future while the call is awaited.
        let request = {
            let mut params = CallToolRequestParams::new(tool.to_string());
            params.arguments = arguments;
            params.input_responses = context.input_responses.clone();
            params.request_state = context.request_state.clone();
            ClientRequest::CallToolRequest(CallToolRequest::new(params))
        };
        let result = self
            .forward("tools/call", request, context, self.config.call_timeout_ms)
            .await?;
        match result {
            ServerResult::CallToolResult(r) => {
                if let Some(error) = self.result_too_large("tools/call", &r) {
                    return Err(error);
                }
                Ok(CallToolResponse::Complete(r))
            }
            ServerResult::InputRequiredResult(r) => Ok(CallToolResponse::InputRequired(r)),
            ServerResult::CreateTaskResult(r) => Ok(CallToolResponse::Task(r)),
            other => Err(self.unexpected("tools/call", &other)),
        }
    }

    /// Forward one `prompts/get` (the MRTR fields of `params` pass through).
    pub async fn get_prompt(
        &self,
        params: GetPromptRequestParams,
        context: &CallContext,
    ) -> Result<GetPromptResponse, UpstreamError> {
        let request = ClientRequest::GetPromptRequest(GetPromptRequest::new(params));
        let timeout = self.config.call_timeout_ms;
        match self
            .forward("prompts/get", request, context, timeout)
            .await?
        {
            ServerResult::GetPromptResult(r) => match self.result_too_large("prompts/get", &r) {
                Some(error) => Err(error),
                None => Ok(GetPromptResponse::Complete(r)),
            },
            ServerResult::InputRequiredResult(r) => Ok(GetPromptResponse::InputRequired(r)),
            other => Err(self.unexpected("prompts/get", &other)),
        }
    }

    /// Forward one `resources/read` (the MRTR fields of `params` pass through).
    pub async fn read_resource(
        &self,
        params: ReadResourceRequestParams,
        context: &CallContext,
    ) -> Result<ReadResourceResponse, UpstreamError> {
        let request = ClientRequest::ReadResourceRequest(ReadResourceRequest::new(params));
        let timeout = self.config.call_timeout_ms;
        match self
            .forward("resources/read", request, context, timeout)
            .await?
        {
            // Blobs are bounded here, by size; nothing reads them.
            ServerResult::ReadResourceResult(r) => {
                match self.result_too_large("resources/read", &r) {
                    Some(error) => Err(error),
                    None => Ok(ReadResourceResponse::Complete(r)),
                }
            }
            ServerResult::InputRequiredResult(r) => Ok(ReadResourceResponse::InputRequired(r)),
            other => Err(self.unexpected("resources/read", &other)),
        }
    }

    /// Forward one `completion/complete`.
    pub async fn complete(
        &self,
        params: CompleteRequestParams,
        context: &CallContext,
    ) -> Result<CompleteResult, UpstreamError> {
        let request = ClientRequest::CompleteRequest(CompleteRequest::new(params));
        let timeout = self.config.list_timeout_ms;
        match self
            .forward("completion/complete", request, context, timeout)
            .await?
        {
            ServerResult::CompleteResult(r) => {
                match self.result_too_large("completion/complete", &r) {
                    Some(error) => Err(error),
                    None => Ok(r),
                }
            }
            other => Err(self.unexpected("completion/complete", &other)),
        }
    }

    /// `resources/subscribe` on a legacy upstream that supports it; updates
    /// arrive as [`crate::UpstreamEvent::ResourceUpdated`]. Returns whether
    /// the upstream took the subscription.
    #[allow(deprecated)] // Legacy-only in rmcp, and only sent to legacy upstreams.
    pub async fn subscribe(&self, uri: &str) -> Result<bool, UpstreamError> {
        let (peer, era) = self.peer().await?;
        if era == Era::Modern || !self.supports_subscribe() {
            return Ok(false);
        }
        peer.subscribe(SubscribeRequestParams::new(uri))
            .await
            .map(|()| true)
            .map_err(|e| self.connection.rpc_error("resources/subscribe", e))
    }

    /// `resources/unsubscribe`, the counterpart of [`Upstream::subscribe`].
    #[allow(deprecated)] // Legacy-only in rmcp, and only sent to legacy upstreams.
    pub async fn unsubscribe(&self, uri: &str) -> Result<(), UpstreamError> {
        let (peer, era) = self.peer().await?;
        if era == Era::Modern || !self.supports_subscribe() {
            return Ok(());
        }
        peer.unsubscribe(UnsubscribeRequestParams::new(uri))
            .await
            .map_err(|e| self.connection.rpc_error("resources/unsubscribe", e))
    }

    fn supports_subscribe(&self) -> bool {
        self.capabilities()
            .and_then(|caps| caps.resources)
            .and_then(|resources| resources.subscribe)
            .unwrap_or(false)
    }

    /// The tools `principal` sees: on a per-principal server, listed over
    /// its own connection; elsewhere, [`Upstream::list_tools`].
    pub async fn list_tools_for(&self, principal: &str) -> Result<ToolListing, UpstreamError> {
        let Some(principals) = &self.principals else {
            return self.list_tools().await;
        };
        let member = principals.member(Some(principal), false).await?;
        let listed = member.list_tools().await;
        principals
            .answer(Some(principal), &member, listed, false)
            .await
    }

    /// All tools of this upstream, paged with guards, within `list_timeout_ms`.
    pub async fn list_tools(&self) -> Result<ToolListing, UpstreamError> {
        if let Some(openapi) = &self.openapi {
            let (listing, changed) = openapi.list_tools(&self.config).await?;
            if changed {
                // Callers hear `list_changed`; the catalog lists once more.
                let _ = self.events.send(crate::UpstreamEvent::ToolsChanged {
                    server: self.config.name.clone(),
                });
            }
            return Ok(listing);
        }
        self.connection.list_tools().await
    }

    /// All prompts, paged like tools.
    pub async fn list_prompts(&self) -> Result<PromptListing, UpstreamError> {
        let (peer, _) = self.peer().await?;
        self.connection
            .list(|params| peer.list_prompts(params))
            .await
    }

    /// All resources, paged like tools.
    pub async fn list_resources(&self) -> Result<ResourceListing, UpstreamError> {
        let (peer, _) = self.peer().await?;
        self.connection
            .list(|params| peer.list_resources(params))
            .await
    }

    /// All resource templates, paged like tools.
    pub async fn list_resource_templates(&self) -> Result<ResourceTemplateListing, UpstreamError> {
        let (peer, _) = self.peer().await?;
        self.connection
            .list(|params| peer.list_resource_templates(params))
            .await
    }

    /// The server's own connection, for a request without a caller.
    async fn peer(&self) -> Result<(Peer<RoleClient>, Era), UpstreamError> {
        let Connected { peer, era, .. } = self.connection.connected().await?;
        Ok((peer, era))
    }

    /// Send one request on behalf of a downstream caller: over the server's
    /// own connection, or on a per-principal server over the caller's.
    pub(super) fn forward<'a>(
        &'a self,
        operation: &'static str,
        request: ClientRequest,
        context: &'a CallContext,
        timeout_ms: u64,
    ) -> impl Future<Output = Result<ServerResult, UpstreamError>> + 'a {
        match &self.principals {
            None => Either::Left(
                self.connection
                    .forward(operation, request, context, timeout_ms),
            ),
            // Boxed: its futures would make every call's future kilobytes
            // larger, and each call copies its future when boxing it.
            Some(principals) => Either::Right(Box::pin(
                self.forward_as_member(principals, operation, request, context, timeout_ms),
            )),
        }
    }

    /// [`Upstream::forward`] on a per-principal server: through the
    /// caller's own connection.
    async fn forward_as_member(
        &self,
        principals: &Principals,
        operation: &'static str,
        request: ClientRequest,
        context: &CallContext,
        timeout_ms: u64,
    ) -> Result<ServerResult, UpstreamError> {
        let principal = context.principal.as_deref();
        let member = principals.member(principal, true).await?;
        let answer = member
            .forward(operation, request, context, timeout_ms)
            .await;
        principals.answer(principal, &member, answer, true).await
    }

    /// `max_result_bytes`, for every result a caller gets.
    pub(super) fn result_too_large(
        &self,
        operation: &'static str,
        result: &impl serde::Serialize,
    ) -> Option<UpstreamError> {
        let limit = self.config.max_result_bytes;
        let bytes = crate::json_len(result);
        if bytes <= limit {
            return None;
        }
        let error = UpstreamError::ResultTooLarge {
            server: self.config.name.clone(),
            bytes,
            limit,
        };
        self.connection.record_error(operation, &error);
        Some(error)
    }

    pub(super) fn unexpected(&self, operation: &str, result: &ServerResult) -> UpstreamError {
        UpstreamError::Protocol {
            server: self.config.name.clone(),
            message: format!("{operation}: unexpected result {result:?}"),
        }
    }
}

impl Connection {
    async fn list_tools(&self) -> Result<ToolListing, UpstreamError> {
        let Connected { peer, .. } = self.connected().await?;
        let listing: ToolListing = self.list(|params| peer.list_tools(params)).await?;
        self.param_header_tools.learn(&listing.items);
        Ok(listing)
    }

    /// Page through one list method within `list_timeout_ms`.
    async fn list<P, F, Fut>(&self, fetch: F) -> Result<Listing<P::Item>, UpstreamError>
    where
        P: Page,
        F: FnMut(Option<PaginatedRequestParams>) -> Fut,
        Fut: Future<Output = Result<P, ServiceError>>,
    {
        let timeout = Duration::from_millis(self.config.list_timeout_ms);
        match tokio::time::timeout(
            timeout,
            list_all::<P, _, _>(&self.config.name, self.config.max_pages, fetch),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(UpstreamError::Timeout {
                server: self.config.name.clone(),
                operation: P::METHOD,
                timeout_ms: self.config.list_timeout_ms,
            }),
        }
    }

    /// Send one request over this connection, holding a concurrency permit,
    /// within `timeout_ms`. While it is in flight its progress, log messages
    /// and server-to-client requests go to the caller's relay. If this
    /// future is dropped (the caller cancelled, or the timeout fired), the
    /// upstream gets `notifications/cancelled`.
    async fn forward(
        &self,
        operation: &'static str,
        request: ClientRequest,
        context: &CallContext,
        timeout_ms: u64,
    ) -> Result<ServerResult, UpstreamError> {
        let started = Instant::now();
        let server = &self.config.name;
        // Names only: arguments never go into a span.
        let span = tracing::info_span!("upstream.request", server = %server, operation);
        let traceparent = crate::trace::traceparent(&span);
        // Pinned in place: the timeout holds a reference, not another copy.
        let work = std::pin::pin!(tracing::Instrument::instrument(
            async {
                let _permit = self.calls.acquire().await.expect("semaphore never closed");
                let Connected { peer, era, plain } = self.connected().await?;
                if let Some(plain) = plain
                    && let Some(name) = plain.takes(&request, context, &self.param_header_tools)
                {
                    // A dropped POST closes its stream: to a stateless upstream
                    // that is the cancellation.
                    let mut result = plain
                        .send(server, request, name, context, traceparent.as_deref())
                        .await?;
                    fill_missing_result_type(&mut result);
                    return Ok(result);
                }
                let mut meta = if era == Era::Modern {
                    context.modern_meta()
                } else {
                    RequestMetaObject::new()
                };
                if let Some(traceparent) = &traceparent {
                    meta.0.set_traceparent(traceparent.clone());
                }
                let mut options = PeerRequestOptions::no_options();
                if era == Era::Modern || traceparent.is_some() {
                    options = options.with_meta(meta);
                }
                let mut handle = peer
                    .send_request_with_option(request, options)
                    .await
                    .map_err(|e| self.rpc_error(operation, e))?;
                let _route =
                    self.routes
                        .register(handle.id.clone(), handle.progress_token.clone(), context);
                let mut cancel = CancelOnDrop {
                    peer: peer.clone(),
                    id: Some(handle.id.clone()),
                };
                let response = (&mut handle.rx).await;
                cancel.id = None;
                match response {
                    Ok(Ok(mut result)) => {
                        fill_missing_result_type(&mut result);
                        Ok(result)
                    }
                    Ok(Err(error)) => Err(self.rpc_error(operation, error)),
                    Err(_) => Err(self.rpc_error(operation, ServiceError::TransportClosed)),
                }
            },
            span
        ));
        let result = match tokio::time::timeout(Duration::from_millis(timeout_ms), work).await {
            Ok(r) => r,
            Err(_) => Err(UpstreamError::Timeout {
                server: server.clone(),
                operation,
                timeout_ms,
            }),
        };
        tracing::debug!(server = %server, operation, elapsed_ms = started.elapsed().as_millis() as u64, ok = result.is_ok(), "upstream request");
        if let Err(error) = &result {
            self.record_error(operation, error);
        }
        result
    }

    fn rpc_error(&self, operation: &'static str, error: ServiceError) -> UpstreamError {
        // rmcp's AuthClient reports a 401 it could not cure by refreshing as
        // a transport error whose text is all that reaches this far.
        if self.config.auth == Some(crate::UpstreamAuth::Oauth)
            && error.to_string().contains("Auth required")
        {
            self.set_needs_sign_in();
            return UpstreamError::AuthRequired {
                server: self.config.name.clone(),
                hint: crate::oauth::sign_in_hint(&self.config.name),
            };
        }
        match error {
            ServiceError::McpError(error) => UpstreamError::Rpc {
                server: self.config.name.clone(),
                error,
            },
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => {
                UpstreamError::Protocol {
                    server: self.config.name.clone(),
                    message: format!("{operation} failed: the connection closed ({error})"),
                }
            }
            other => UpstreamError::Protocol {
                server: self.config.name.clone(),
                message: format!("{operation} failed: {other}"),
            },
        }
    }
}

/// Sends `notifications/cancelled` for a request that is dropped before its
/// response arrived.
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        let peer = self.peer.clone();
        let params = CancelledNotificationParam::new(
            Some(id),
            Some("cancelled by the downstream caller".to_string()),
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = peer.notify_cancelled(params).await;
            });
        }
    }
}

/// A 2025-era upstream sends no `resultType`; 2026-07-28 clients require it
/// (absent means "complete"). rmcp strips it again for legacy downstream peers.
fn fill_missing_result_type(result: &mut ServerResult) {
    let result_type = match result {
        ServerResult::CallToolResult(r) => &mut r.result_type,
        ServerResult::GetPromptResult(r) => &mut r.result_type,
        ServerResult::ReadResourceResult(r) => &mut r.result_type,
        ServerResult::CompleteResult(r) => &mut r.result_type,
        ServerResult::ListToolsResult(r) => &mut r.result_type,
        ServerResult::ListPromptsResult(r) => &mut r.result_type,
        ServerResult::ListResourcesResult(r) => &mut r.result_type,
        ServerResult::ListResourceTemplatesResult(r) => &mut r.result_type,
        _ => return,
    };
    result_type.get_or_insert(rmcp::model::ResultType::COMPLETE);
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use rmcp::{
        ErrorData, RoleServer, ServerHandler,
        model::{
            CallToolResult, ListToolsResult, NumberOrString, ServerCapabilities, ServerConfig, Tool,
        },
        service::RequestContext,
        transport::streamable_http_server::{
            StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
        },
    };
    use serde_json::{Value, json};

    use super::*;
    use crate::UpstreamConfig;

    /// A stateless 2026-07-28 upstream on rmcp's own server: `echo` answers
    /// with its arguments, text and structured; `fail` is a tool error; any
    /// other name is a JSON-RPC error. It notes the id of every call.
    #[derive(Clone, Default)]
    struct Echo {
        ids: Arc<Mutex<Vec<NumberOrString>>>,
    }

    impl ServerHandler for Echo {
        fn get_info(&self) -> ServerConfig {
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        }

        async fn list_tools(
            &self,
            _request: Option<rmcp::model::PaginatedRequestParams>,
            _context: RequestContext<RoleServer>,
        ) -> Result<ListToolsResult, ErrorData> {
            let schema = json!({"type": "object"}).as_object().unwrap().clone();
            Ok(ListToolsResult::with_all_items(vec![
                Tool::new("echo", "", Arc::new(schema.clone())),
                Tool::new("fail", "", Arc::new(schema)),
            ]))
        }

        async fn call_tool(
            &self,
            request: CallToolRequestParams,
            context: RequestContext<RoleServer>,
        ) -> Result<CallToolResponse, ErrorData> {
            self.ids.lock().unwrap().push(context.id);
            let arguments = Value::Object(request.arguments.unwrap_or_default());
            match request.name.as_ref() {
                "echo" => Ok(CallToolResponse::Complete(CallToolResult::structured(
                    arguments,
                ))),
                "fail" => Ok(CallToolResponse::Complete(
                    CallToolResult::structured_error(arguments),
                )),
                other => Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
            }
        }
    }

    async fn serve(echo: Echo) -> String {
        let config = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true);
        let service = StreamableHttpService::new(
            move || Ok(echo.clone()),
            Arc::new(LocalSessionManager::default()),
            config,
        );
        let router = axum::Router::new().nest_service("/mcp", service);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        format!("http://{address}/mcp")
    }

    /// What a caller gets from one call: the result, or the error's text.
    async fn call(upstream: &Upstream, tool: &str) -> Result<Value, String> {
        let arguments = json!({"message": "hi", "n": [1, 2.5, null]});
        match upstream
            .call_tool_with(
                tool,
                arguments.as_object().cloned(),
                &CallContext::default(),
            )
            .await
        {
            Ok(CallToolResponse::Complete(result)) => Ok(serde_json::to_value(result).unwrap()),
            Ok(_) => Err("not a complete result".into()),
            Err(error) => Err(error.to_string()),
        }
    }

    /// `plain_calls` on, a call to a stateless HTTP upstream is the
    /// gateway's own POST (its ids are negative); off, it goes through
    /// rmcp's client. Results and errors are the same either way.
    #[tokio::test]
    async fn with_plain_calls_off_a_call_goes_through_rmcp_with_the_same_result() {
        let echo = Echo::default();
        let url = serve(echo.clone()).await;
        let mut answers = Vec::new();
        for plain_calls in [true, false] {
            let mut config = UpstreamConfig::http("echo", &url);
            config.plain_calls = plain_calls;
            let (events, _) = tokio::sync::mpsc::unbounded_channel();
            let upstream = Upstream::new(config, events, Default::default());
            upstream.connect().await.unwrap();
            assert_eq!(upstream.era(), Some(Era::Modern));
            upstream.list_tools().await.unwrap();
            let mut answered = Vec::new();
            for tool in ["echo", "fail", "nope"] {
                answered.push(call(&upstream, tool).await);
            }
            let ids = std::mem::take(&mut *echo.ids.lock().unwrap());
            assert_eq!(ids.len(), 3, "{ids:?}");
            let plain = ids
                .iter()
                .all(|id| matches!(id, NumberOrString::Number(n) if *n < 0));
            let rmcps = ids
                .iter()
                .all(|id| matches!(id, NumberOrString::Number(n) if *n >= 0));
            assert!(
                if plain_calls { plain } else { rmcps },
                "plain_calls = {plain_calls}: ids {ids:?}"
            );
            upstream.disconnect().await;
            answers.push(answered);
        }
        assert!(answers[0][0].is_ok(), "{:?}", answers[0]);
        assert_eq!(answers[0], answers[1]);
    }
}
