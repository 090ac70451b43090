//! The gateway as rmcp's client handler: what an upstream says unasked.
//! Notifications the catalog needs become [`UpstreamEvent`]s; progress,
//! logs and server-to-client requests that belong to an in-flight request
//! go to the downstream caller that made it.

// Sampling, roots and logging are deprecated by SEP-2577; the gateway still
// relays them for the clients and servers that use them.
#![allow(deprecated)]

use std::sync::Arc;

use rmcp::{
    ClientHandler, ErrorData, RoleClient,
    model::{
        ClientCapabilities, ClientConfig, ClientResult, CreateMessageRequestParams,
        CreateMessageResult, ElicitRequestParams, ElicitResult, Implementation, ListRootsResult,
        ResourceUpdatedNotificationParam, ServerNotification, ServerRequest, SubscriptionFilter,
    },
    service::{InboundStreamOrigin, NotificationContext, Peer, RequestContext},
};
use tokio::sync::{mpsc, oneshot};

use crate::{Relay, UpstreamEvent, relay::Routes};

/// Receives upstream notifications for the catalog, and relays what belongs
/// to an in-flight request (progress, logs, server-to-client requests) to the
/// downstream caller that made it.
#[derive(Clone)]
pub(crate) struct UpstreamHandler {
    server: String,
    events: mpsc::UnboundedSender<UpstreamEvent>,
    routes: Arc<Routes>,
}

impl UpstreamHandler {
    pub(super) fn new(
        server: &str,
        events: &mpsc::UnboundedSender<UpstreamEvent>,
        routes: &Arc<Routes>,
    ) -> Self {
        Self {
            server: server.to_string(),
            events: events.clone(),
            routes: Arc::clone(routes),
        }
    }

    /// On a modern upstream, holds a `subscriptions/listen` stream for list
    /// changes while the connection lasts.
    pub(super) async fn listen_for_changes(&self, peer: Peer<RoleClient>) {
        let filter = SubscriptionFilter::builder()
            .tools_list_changed()
            .prompts_list_changed()
            .resources_list_changed()
            .build();
        let Ok(mut subscription) = peer.listen(filter).await else {
            tracing::debug!(server = %self.server, "upstream refused subscriptions/listen");
            return;
        };
        let server = &self.server;
        while let Ok(Some(notification)) = subscription.next().await {
            let event = match notification {
                ServerNotification::ToolListChangedNotification(_) => UpstreamEvent::ToolsChanged {
                    server: server.clone(),
                },
                ServerNotification::PromptListChangedNotification(_) => {
                    UpstreamEvent::PromptsChanged {
                        server: server.clone(),
                    }
                }
                ServerNotification::ResourceListChangedNotification(_) => {
                    UpstreamEvent::ResourcesChanged {
                        server: server.clone(),
                    }
                }
                _ => continue,
            };
            self.event(event);
        }
    }

    /// Hand a server-to-client request to the caller of the request it
    /// belongs to, and wait for the caller's answer.
    async fn relay_request(
        &self,
        request: ServerRequest,
        context: &RequestContext<RoleClient>,
    ) -> Result<ClientResult, ErrorData> {
        let associated = match context.extensions.get::<InboundStreamOrigin>() {
            Some(InboundStreamOrigin::OutboundRequest(id)) => Some(id.clone()),
            _ => None,
        };
        let Some(relay) = self.routes.for_request(associated.as_ref()) else {
            return Err(ErrorData::invalid_request(
                "no downstream request is in flight to answer this request",
                None,
            ));
        };
        let (reply, answer) = oneshot::channel();
        relay
            .send(Relay::Request { request, reply })
            .map_err(|_| ErrorData::internal_error("the downstream caller went away", None))?;
        tokio::select! {
            answer = answer => answer
                .unwrap_or_else(|_| Err(ErrorData::internal_error("the downstream caller went away", None))),
            () = context.ct.cancelled() => Err(ErrorData::internal_error("cancelled by the upstream", None)),
        }
    }

    fn event(&self, event: UpstreamEvent) {
        let _ = self.events.send(event);
    }
}

impl ClientHandler for UpstreamHandler {
    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let request =
            ServerRequest::CreateMessageRequest(rmcp::model::CreateMessageRequest::new(params));
        match self.relay_request(request, &context).await? {
            ClientResult::CreateMessageResult(result) => Ok(*result),
            other => Err(unexpected_answer(&other)),
        }
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let request = ServerRequest::ElicitRequest(rmcp::model::ElicitRequest::new(params));
        match self.relay_request(request, &context).await? {
            ClientResult::ElicitResult(result) => Ok(result),
            other => Err(unexpected_answer(&other)),
        }
    }

    async fn list_roots(
        &self,
        context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        let request = ServerRequest::ListRootsRequest(rmcp::model::ListRootsRequest::default());
        match self.relay_request(request, &context).await? {
            ClientResult::ListRootsResult(result) => Ok(result),
            other => Err(unexpected_answer(&other)),
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.event(UpstreamEvent::ToolsChanged {
            server: self.server.clone(),
        });
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.event(UpstreamEvent::PromptsChanged {
            server: self.server.clone(),
        });
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.event(UpstreamEvent::ResourcesChanged {
            server: self.server.clone(),
        });
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.event(UpstreamEvent::ResourceUpdated {
            server: self.server.clone(),
            uri: params.uri,
        });
    }

    fn get_info(&self) -> ClientConfig {
        handler_info()
    }
}

/// Who the gateway says it is to upstreams.
pub(super) fn handler_info() -> ClientConfig {
    // Everything a downstream client might answer is relayed; per request,
    // 2026-07-28 upstreams see the real client's capabilities instead.
    let capabilities: ClientCapabilities = serde_json::from_value(serde_json::json!({
        "sampling": {}, "elicitation": {}, "roots": {}
    }))
    .expect("client capabilities literal is valid");
    ClientConfig::new(
        capabilities,
        Implementation::new("manifold", env!("CARGO_PKG_VERSION")),
    )
}

fn unexpected_answer(result: &ClientResult) -> ErrorData {
    ErrorData::internal_error(
        format!("the downstream client answered with an unexpected result: {result:?}"),
        None,
    )
}
