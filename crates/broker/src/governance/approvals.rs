//! Approvals: the approval a call needs is found or filed, waited for and
//! consumed; the caller's own client may be asked (the taint rule only).

use manifold_store::{ApprovalError, ApprovalStatus, StoreError, now_ms};
use manifold_upstream::CallContext;
use rmcp::model::JsonObject;
use serde_json::{Value, json};

use super::{Governance, caller::Caller, refusal::Refusal};

impl Governance {
    /// Finds or files the approval for this exact call, waits for an
    /// operator's decision and consumes it. Returns the approval id.
    pub(super) async fn await_approval(
        &self,
        caller: &Caller,
        tool: &str,
        arguments: &JsonObject,
        args_hash: &str,
        presented: Option<&str>,
        ask_caller: Option<&CallContext>,
    ) -> Result<String, Refusal> {
        let id = match presented {
            Some(id) => id.to_string(),
            None => {
                self.open_approval(caller, tool, arguments, args_hash)
                    .await?
            }
        };
        let deadline = tokio::time::Instant::now() + self.config.approval_wait;
        // The caller's own user may answer while the operator has not; the
        // question is withdrawn when the wait ends.
        let _asking =
            ask_caller.and_then(|context| self.ask_caller(context, caller, tool, arguments, &id));
        loop {
            // Registered before the read, so a decision between the read and
            // the wait is not missed.
            let decided = self.approvals_decided.notified();
            tokio::pin!(decided);
            decided.as_mut().enable();
            let approval = self
                .store
                .get_approval(&id)
                .await?
                .ok_or(Refusal::Approval(ApprovalError::NotFound))?;
            match approval.status {
                ApprovalStatus::Approved => {
                    self.store
                        .consume_approval(&id, &caller.name, tool, args_hash, now_ms())
                        .await
                        .map_err(Refusal::Approval)?;
                    return Ok(id);
                }
                ApprovalStatus::Denied => return Err(Refusal::ApprovalDenied { approval_id: id }),
                ApprovalStatus::Pending if approval.expires_at <= now_ms() => {
                    return Err(Refusal::Approval(ApprovalError::Expired));
                }
                ApprovalStatus::Pending => {}
            }
            if approval.principal != caller.name
                || approval.tool != tool
                || approval.args_hash != args_hash
            {
                return Err(Refusal::Approval(ApprovalError::Mismatch));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Refusal::ApprovalRequired {
                    approval_id: id,
                    expires_at: approval.expires_at,
                    reason: None,
                });
            }
            // The poll is the fallback when no event arrives (SQLite, or a
            // lost listener connection).
            let wait = self
                .config
                .approval_poll
                .min(deadline.saturating_duration_since(tokio::time::Instant::now()));
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = &mut decided => {}
            }
        }
    }

    /// The open approval for this exact call, else a new one.
    async fn open_approval(
        &self,
        caller: &Caller,
        tool: &str,
        arguments: &JsonObject,
        args_hash: &str,
    ) -> Result<String, StoreError> {
        let open = self
            .store
            .find_open_approval(&caller.name, tool, args_hash, now_ms())
            .await?;
        match open {
            Some(open) => Ok(open.id),
            None => self.file_approval(caller, tool, arguments, args_hash).await,
        }
    }

    /// Sends an approval question to the caller's client through the call's
    /// relay, if elicitation is on and the client declared it. Only an
    /// explicit `approve: true` approves and an explicit decline denies; any
    /// other answer leaves it to the operator. Used for the taint rule only.
    fn ask_caller(
        &self,
        context: &CallContext,
        caller: &Caller,
        tool: &str,
        arguments: &JsonObject,
        approval_id: &str,
    ) -> Option<AbortOnDrop> {
        if !self.config.approval_elicitation {
            return None;
        }
        let relay = context.relay.clone()?;
        context.client_capabilities.as_ref()?.elicitation.as_ref()?;
        let message = format!(
            "Manifold: approve a call to {} with arguments {}? (approval {approval_id})",
            tool,
            self.redact(&Value::Object(arguments.clone()))
        );
        let request: rmcp::model::ServerRequest = serde_json::from_value(json!({
            "method": "elicitation/create",
            "params": {
                "mode": "form",
                "message": message,
                "requestedSchema": {
                    "type": "object",
                    "properties": {"approve": {"type": "boolean", "title": "Approve this call"}},
                    "required": ["approve"],
                },
            },
        }))
        .ok()?;
        let store = self.store.clone();
        let (id, by) = (
            approval_id.to_string(),
            format!("elicitation:{}", caller.name),
        );
        let task = tokio::spawn(async move {
            let (reply, answer) = tokio::sync::oneshot::channel();
            if relay
                .send(manifold_upstream::Relay::Request { request, reply })
                .is_err()
            {
                return;
            }
            let Ok(Ok(rmcp::model::ClientResult::ElicitResult(result))) = answer.await else {
                return;
            };
            let approve = match result.action {
                rmcp::model::ElicitationAction::Accept => {
                    match result.content.as_ref().and_then(|c| c["approve"].as_bool()) {
                        Some(answer) => answer,
                        None => return,
                    }
                }
                rmcp::model::ElicitationAction::Decline => false,
                _ => return,
            };
            if let Err(error) = store.decide_approval(&id, approve, &by).await {
                tracing::debug!(%error, approval = %id, "elicited decision not recorded");
            }
        });
        Some(AbortOnDrop(task))
    }

    async fn file_approval(
        &self,
        caller: &Caller,
        tool: &str,
        arguments: &JsonObject,
        args_hash: &str,
    ) -> Result<String, StoreError> {
        let redacted = self.redact(&Value::Object(arguments.clone()));
        let ttl_ms = i64::try_from(self.config.approval_ttl.as_millis()).unwrap_or(i64::MAX);
        let expires_at = now_ms().saturating_add(ttl_ms);
        let id = self
            .store
            .create_approval(&caller.name, tool, args_hash, &redacted, expires_at)
            .await?;
        tracing::info!(approval = %id, tool = %tool, caller = %caller.name, "approval requested");
        if let Some(url) = self.config.approval_webhook.clone() {
            let body = json!({
                "event": "approval_requested",
                "approval_id": id,
                "principal": caller.name,
                "tool": tool,
                "arguments": redacted,
                "args_hash": args_hash,
                "expires_at": expires_at,
            });
            let http = self.http.clone();
            // The call waits on the store, not on the webhook's receiver.
            tokio::spawn(async move {
                if let Err(error) = http.post(&url).json(&body).send().await {
                    tracing::warn!(%error, "approval webhook failed");
                }
            });
        }
        Ok(id)
    }
}

/// Aborts a background task when the scope that started it ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
