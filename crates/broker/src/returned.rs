//! One guard for everything that comes back from an upstream, not only a
//! tool's result: `prompts/get`, `resources/read` (resource templates
//! included), `completion/complete`, an upstream's errors, and the input
//! requests of an `InputRequiredResult`. Each passes the guardrails of
//! `guardrails.rs` (masking, this server's `max_result_chars`), and each
//! answer, success or upstream error, writes one activity row with its kind
//! and what was masked or cut, as a refusal does. `max_result_bytes` is
//! checked upstream, before anything is read.

use std::time::Instant;

use manifold_store::{CallOutcome, Decision, hash_argument_object};
use manifold_upstream::{Upstream, UpstreamError};
use rmcp::model::{
    CallToolResponse, CompleteResult, GetPromptResponse, InputRequiredResult, JsonObject,
    ReadResourceResponse,
};
use serde_json::{Value, json};

use crate::{
    Broker, BrokerError,
    governance::{caller::Caller, rules::RequestKind},
    guardrails::{GuardReport, Guardrails, mask_text},
};

/// A response that comes back from an upstream and is guarded as a whole.
pub(crate) trait Returned {
    /// Guards `self` in place; `Err` when it cannot be passed on.
    fn guard(&mut self, guardrails: &Guardrails, max_chars: usize) -> Result<GuardReport, String>;

    /// Its size as JSON, for the audit.
    fn bytes(&self) -> usize;
}

impl Returned for GetPromptResponse {
    fn guard(&mut self, guardrails: &Guardrails, max_chars: usize) -> Result<GuardReport, String> {
        match self {
            GetPromptResponse::Complete(r) => guardrails.guard_returned(r, max_chars),
            GetPromptResponse::InputRequired(r) => guard_input_required(guardrails, r),
            _ => Err("an unknown prompts/get response".into()),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            GetPromptResponse::Complete(r) => manifold_upstream::json_len(r),
            GetPromptResponse::InputRequired(r) => manifold_upstream::json_len(r),
            _ => 0,
        }
    }
}

impl Returned for ReadResourceResponse {
    fn guard(&mut self, guardrails: &Guardrails, max_chars: usize) -> Result<GuardReport, String> {
        match self {
            ReadResourceResponse::Complete(r) => guardrails.guard_returned(r, max_chars),
            ReadResourceResponse::InputRequired(r) => guard_input_required(guardrails, r),
            _ => Err("an unknown resources/read response".into()),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            ReadResourceResponse::Complete(r) => manifold_upstream::json_len(r),
            ReadResourceResponse::InputRequired(r) => manifold_upstream::json_len(r),
            _ => 0,
        }
    }
}

impl Returned for CompleteResult {
    fn guard(&mut self, guardrails: &Guardrails, max_chars: usize) -> Result<GuardReport, String> {
        Ok(guardrails.guard_completion(self, max_chars))
    }

    fn bytes(&self) -> usize {
        manifold_upstream::json_len(self)
    }
}

/// The questions an upstream asks (elicitation, sampling) and the result's
/// `_meta` are masked; `requestState` is the upstream's own opaque state,
/// echoed back to it unread, and passes as it is.
pub(crate) fn guard_input_required(
    guardrails: &Guardrails,
    result: &mut InputRequiredResult,
) -> Result<GuardReport, String> {
    let mut report = GuardReport::default();
    if let Some(requests) = &mut result.input_requests {
        report.merge(guardrails.guard_returned(requests, 0)?);
    }
    if let Some(meta) = &mut result.meta {
        report.merge(guardrails.guard_returned(meta, 0)?);
    }
    Ok(report)
}

/// An upstream's error, masked where it carries the upstream's own text.
pub(crate) fn guard_error(guardrails: &Guardrails, error: &mut UpstreamError) -> GuardReport {
    let mut report = GuardReport::default();
    if !guardrails.mask_secrets {
        return report;
    }
    match error {
        UpstreamError::Rpc { error, .. } => report = guardrails.guard_error(error),
        UpstreamError::Protocol { message: text, .. }
        | UpstreamError::Connect { reason: text, .. } => {
            if let Some(clean) = mask_text(text, &mut report.masked) {
                *text = clean;
            }
        }
        _ => {}
    }
    report
}

/// A tool call's response other than a complete result (an upstream error,
/// an `InputRequiredResult`), guarded like any other answer.
pub(crate) fn guard_call_response(
    guardrails: &Guardrails,
    response: &mut Result<CallToolResponse, UpstreamError>,
) -> GuardReport {
    match response {
        Err(error) => guard_error(guardrails, error),
        Ok(CallToolResponse::InputRequired(r)) => match guard_input_required(guardrails, r) {
            Ok(report) => report,
            Err(why) => {
                *response = Err(unguardable(&why));
                GuardReport::default()
            }
        },
        Ok(_) => GuardReport::default(),
    }
}

fn unguardable(why: &str) -> UpstreamError {
    UpstreamError::Protocol {
        server: String::new(),
        message: format!(
            "the upstream's answer could not be guarded, so it was not passed on: {why}"
        ),
    }
}

/// What one answered request was, for its activity row.
pub(crate) struct Answered<'a> {
    pub caller: &'a Caller,
    pub kind: RequestKind,
    /// What the request named, as its refusal would: a prompt's exposed
    /// name, `server__*` for a server's resources.
    pub named: &'a str,
    pub arguments: &'a JsonObject,
    pub started: Instant,
}

impl Broker {
    /// Guards what `upstream` answered (see the module doc) and records its
    /// activity row. A response that cannot be guarded becomes an error; one
    /// whose row cannot be made durable is not passed on (`audit_failure`).
    pub(crate) async fn returned<T: Returned>(
        &self,
        answered: Answered<'_>,
        upstream: &Upstream,
        mut result: Result<T, UpstreamError>,
    ) -> Result<T, BrokerError> {
        let guardrails = self.governance.config().guardrails;
        let max_chars = upstream
            .config()
            .max_result_chars
            .unwrap_or(guardrails.max_result_chars);
        let mut report = match &mut result {
            Ok(response) => match response.guard(&guardrails, max_chars) {
                Ok(report) => report,
                Err(why) => {
                    result = Err(unguardable(&why));
                    GuardReport::default()
                }
            },
            Err(error) => guard_error(&guardrails, error),
        };
        let (outcome, bytes_out, mut details) = match &result {
            Ok(response) => (
                CallOutcome::Success,
                response.bytes() as u64,
                report.to_json(),
            ),
            Err(error) => {
                let mut details = std::mem::take(&mut report).to_json();
                details["upstream_error"] = error.to_string().into();
                (CallOutcome::Error, 0, details)
            }
        };
        if let Value::Object(details) = &mut details {
            details.insert("kind".into(), answered.kind.as_str().into());
            details.insert("server".into(), upstream.name().into());
        }
        self.governance
            .record_call(
                answered.caller,
                answered.named,
                answered.arguments,
                hash_argument_object(answered.arguments),
                Decision::Allowed,
                None,
                outcome,
                answered.started.elapsed(),
                bytes_out,
                details,
            )
            .await?;
        Ok(result?)
    }
}

/// The arguments a resource request is recorded with: its URI, kept as a
/// hash like any arguments.
pub(crate) fn uri_arguments(uri: &str) -> JsonObject {
    match json!({ "uri": uri }) {
        Value::Object(map) => map,
        _ => unreachable!("an object literal"),
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::{
        ContentBlock, ErrorData, GetPromptResult, PromptMessage, ReadResourceResult,
        ResourceContents, Role,
    };

    use super::*;

    const AWS: &str = "AKIAIOSFODNN7EXAMPLE";
    const GITHUB: &str = "ghp_0123456789abcdefghijABCDEFGHIJ012345";

    fn guardrails() -> Guardrails {
        Guardrails {
            mask_secrets: true,
            max_result_chars: 0,
        }
    }

    fn meta(value: Value) -> rmcp::model::MetaObject {
        match value {
            Value::Object(map) => rmcp::model::MetaObject(map),
            _ => unreachable!(),
        }
    }

    #[test]
    fn a_resource_is_masked_everywhere_but_its_blob_and_keys_stay_unique() {
        let mut result = ReadResourceResult::new(vec![
            ResourceContents::text(format!("key {AWS}"), "file:///creds")
                .with_meta(meta(json!({ GITHUB: {"scope": "repo"}, "note": GITHUB }))),
            ResourceContents::blob(format!("{AWS}xx=="), "file:///blob"),
        ]);
        result.meta = Some(meta(json!({
            GITHUB: 1,
            "ghp_ABCDEFGHIJ0123456789abcdefghij012345": 2,
            "[masked:github_token#1]": 3,
        })));
        let mut response = ReadResourceResponse::Complete(result);
        let report = response.guard(&guardrails(), 0).unwrap();
        let out = serde_json::to_value(match &response {
            ReadResourceResponse::Complete(r) => r,
            _ => unreachable!(),
        })
        .unwrap();
        let text = out.to_string();
        assert!(!text.contains(GITHUB), "{text}");
        assert_eq!(out["contents"][0]["text"], "key [masked:aws_access_key]");
        let inner = &out["contents"][0]["_meta"];
        assert_eq!(inner["[masked:github_token#1]"], json!({"scope": "repo"}));
        assert_eq!(inner["note"], "[masked:github_token]");
        // The blob is not read: its bytes are the upstream's, bounded by size.
        assert_eq!(out["contents"][1]["blob"], format!("{AWS}xx=="));
        // Three keys, one of them already named like a masked one: all kept.
        let outer = out["_meta"].as_object().unwrap();
        assert_eq!(outer.len(), 3, "{outer:?}");
        assert_eq!(outer["[masked:github_token#1]"], 3);
        let mut values: Vec<i64> = outer.values().map(|v| v.as_i64().unwrap()).collect();
        values.sort();
        assert_eq!(values, [1, 2, 3]);
        assert_eq!(report.masked["github_token"], 4);
        assert_eq!(report.masked["aws_access_key"], 1);
    }

    #[test]
    fn prompt_text_is_masked_and_cut_and_completions_drop_what_is_past_the_limit() {
        let mut response = GetPromptResponse::Complete(
            GetPromptResult::new(vec![
                PromptMessage::new_text(Role::User, format!("use {GITHUB}")),
                PromptMessage::new(Role::User, ContentBlock::text("x".repeat(50))),
            ])
            .with_description(format!("for {AWS}")),
        );
        let report = response.guard(&guardrails(), 40).unwrap();
        let GetPromptResponse::Complete(result) = &response else {
            unreachable!()
        };
        let out = serde_json::to_string(result).unwrap();
        assert!(!out.contains(GITHUB) && !out.contains(AWS), "{out}");
        assert!(out.contains("[truncated:"), "{out}");
        assert!(report.truncated_chars > 0);

        let mut completion = CompleteResult::default();
        completion.completion.values = vec!["abc".into(), GITHUB.into(), "z".repeat(30)];
        let report = completion.guard(&guardrails(), 30).unwrap();
        assert_eq!(
            completion.completion.values,
            ["abc", "[masked:github_token]"],
            "the third is past the limit"
        );
        assert_eq!(report.truncated_chars, 30);
    }

    /// What is relayed during a call (`server/src/mcp/forward.rs`) keeps
    /// its type through the guard: a sampling and an elicitation request,
    /// a log message, a progress message.
    #[test]
    #[allow(deprecated)] // Logging and sampling are still relayed.
    fn relayed_requests_and_messages_are_masked_and_keep_their_type() {
        use rmcp::model::{
            LoggingLevel, LoggingMessageNotificationParam, NumberOrString,
            ProgressNotificationParam, ProgressToken, ServerRequest,
        };
        let guardrails = guardrails();
        for request in [
            json!({"method": "sampling/createMessage", "params": {
                "messages": [{"role": "user", "content": {"type": "text", "text": GITHUB}}],
                "maxTokens": 10}}),
            json!({"method": "elicitation/create", "params": {
                "message": format!("paste {AWS}"),
                "requestedSchema": {"type": "object", "properties": {}}}}),
        ] {
            let method = request["method"].clone();
            let mut request: ServerRequest = serde_json::from_value(request).unwrap();
            let report = guardrails.guard_returned(&mut request, 0).unwrap();
            assert_eq!(report.masked.values().sum::<usize>(), 1, "{method}");
            let out = serde_json::to_value(&request).unwrap();
            assert_eq!(out["method"], method);
            let shown = out.to_string();
            assert!(!shown.contains(GITHUB) && !shown.contains(AWS), "{shown}");
        }
        let mut log = LoggingMessageNotificationParam::new(
            LoggingLevel::Info,
            json!({ GITHUB: "x", "line": format!("key={AWS}") }),
        );
        let report = guardrails.guard_returned(&mut log, 0).unwrap();
        assert_eq!(report.masked.values().sum::<usize>(), 2);
        assert!(!log.data.to_string().contains(GITHUB));
        let mut progress =
            ProgressNotificationParam::new(ProgressToken(NumberOrString::Number(7)), 0.5)
                .with_message(format!("uploading with {GITHUB}"));
        guardrails.guard_returned(&mut progress, 0).unwrap();
        assert_eq!(
            progress.message.as_deref(),
            Some("uploading with [masked:github_token]")
        );
    }

    #[test]
    fn upstream_errors_are_masked() {
        let mut error = UpstreamError::Rpc {
            server: "vault".into(),
            error: ErrorData::internal_error(
                format!("bad key {AWS}"),
                Some(json!({ GITHUB: "x", "detail": GITHUB })),
            ),
        };
        let report = guard_error(&guardrails(), &mut error);
        let UpstreamError::Rpc { error: data, .. } = &error else {
            unreachable!()
        };
        let shown = format!("{error} {}", serde_json::to_string(data).unwrap());
        assert!(!shown.contains(AWS) && !shown.contains(GITHUB), "{shown}");
        assert_eq!(report.masked["github_token"], 2);
    }
}
