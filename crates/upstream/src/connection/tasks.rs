//! `tasks/get`, `tasks/update` and `tasks/cancel` (the
//! `io.modelcontextprotocol/tasks` extension) for a task the upstream made,
//! by the upstream's own task id. The caller's declared capabilities go
//! with each request in its `_meta`, as with every request to a 2026-07-28
//! upstream.

use rmcp::model::{
    CancelTaskParams, CancelTaskRequest, ClientRequest, GetTaskParams, GetTaskRequest,
    GetTaskResult, InputResponses, ServerResult, UpdateTaskParams, UpdateTaskRequest,
};

use super::Upstream;
use crate::{CallContext, UpstreamError};

impl Upstream {
    /// Whether the server declared the tasks extension on its current (or
    /// last) connection.
    pub fn supports_tasks(&self) -> bool {
        self.capabilities()
            .is_some_and(|capabilities| capabilities.supports_tasks())
    }

    /// `tasks/get` of the upstream's task `upstream_id`; a finished task's
    /// result is inlined and counts against `max_result_bytes`.
    pub async fn get_task(
        &self,
        upstream_id: &str,
        context: &CallContext,
    ) -> Result<GetTaskResult, UpstreamError> {
        let request =
            ClientRequest::GetTaskRequest(GetTaskRequest::new(GetTaskParams::new(upstream_id)));
        let timeout = self.config.list_timeout_ms;
        match self.forward("tasks/get", request, context, timeout).await? {
            ServerResult::GetTaskResult(r) => match self.result_too_large("tasks/get", &r) {
                Some(error) => Err(error),
                None => Ok(r),
            },
            other => Err(self.unexpected("tasks/get", &other)),
        }
    }

    /// `tasks/update`: the caller's answers to the task's `inputRequests`.
    pub async fn update_task(
        &self,
        upstream_id: &str,
        input_responses: InputResponses,
        context: &CallContext,
    ) -> Result<(), UpstreamError> {
        let request = ClientRequest::UpdateTaskRequest(UpdateTaskRequest::new(
            UpdateTaskParams::new(upstream_id, input_responses),
        ));
        self.task_ack("tasks/update", request, context).await
    }

    /// `tasks/cancel`: cooperative; the upstream settles the task.
    pub async fn cancel_task(
        &self,
        upstream_id: &str,
        context: &CallContext,
    ) -> Result<(), UpstreamError> {
        let request = ClientRequest::CancelTaskRequest(CancelTaskRequest::new(
            CancelTaskParams::new(upstream_id),
        ));
        self.task_ack("tasks/cancel", request, context).await
    }

    async fn task_ack(
        &self,
        operation: &'static str,
        request: ClientRequest,
        context: &CallContext,
    ) -> Result<(), UpstreamError> {
        let timeout = self.config.list_timeout_ms;
        match self.forward(operation, request, context, timeout).await? {
            ServerResult::TaskAckResult(_) | ServerResult::EmptyResult(_) => Ok(()),
            other => Err(self.unexpected(operation, &other)),
        }
    }
}
