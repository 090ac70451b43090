//! The one door on the MCP surface, as a checked table: every kind of
//! client request rmcp has, and how the gateway decides it before anything
//! upstream happens. The decisions themselves are made in `handler.rs`,
//! whose methods ask the broker; this map is what a reviewer checks a new
//! kind against.
//!
//! It is a test, not a dispatcher: rmcp's Streamable HTTP service serves a
//! `ServerHandler` and dispatches requests itself, so no layer of ours sees
//! a `ClientRequest` before the handler method for it.

use rmcp::model::ClientRequest;

/// How one kind of client request is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// The gateway answers from its own state; nothing goes upstream
    /// (`initialize`, `server/discover`, `ping`).
    Gateway,
    /// A listing, filtered to what the caller may use: tools by
    /// governance's `visible` (progressive mode lists its constant
    /// meta-tools), prompts by qualified name, resources and templates by
    /// server.
    Listing,
    /// `tools/call`: the broker decides the tool. Of the meta-tools,
    /// `call_tool` and a script's calls are tool calls too; a caller's
    /// server switches are decided by `allow_server_switch`,
    /// `execute_code` by `allow_code`; the searches read the filtered view.
    ToolCall,
    /// `prompts/get`: by the prompt's qualified name.
    Prompt,
    /// `resources/read`: by the resource's server (`server__*`).
    Resource,
    /// `completion/complete`: as the prompt or resource it completes.
    Completion,
    /// `resources/subscribe`, `resources/unsubscribe`, and the resource
    /// subscriptions of a `subscriptions/listen` stream: as the resource.
    Subscription,
    /// `logging/setLevel`: sets the caller's own session level only.
    OwnLogLevel,
    /// `tasks/get`, `tasks/update`, `tasks/cancel`: the broker finds the
    /// task among the caller's own and decides it by its server
    /// (`server__*`); another caller's task is an unknown id.
    Task,
    /// Not served (skills, custom methods, and `tasks/list` and
    /// `tasks/result`, which the tasks extension removed): rmcp answers
    /// method-not-found, and the handler has no code that could reach an
    /// upstream for them.
    Refused,
    /// A kind this map does not know yet.
    Unknown,
}

/// The rule for `request`. `ClientRequest` is `#[non_exhaustive]`, so the
/// compiler demands a last arm for kinds a later rmcp adds; such a kind
/// maps to `Unknown`, which the table test below refuses to accept for any
/// method it sends. (rmcp's default for a new `ServerHandler` method is
/// method-not-found, and only the handler's own code reaches upstreams, so
/// a new kind is closed until it is given a rule and a decision.)
pub(crate) fn rule(request: &ClientRequest) -> Rule {
    match request {
        ClientRequest::PingRequest(_)
        | ClientRequest::InitializeRequest(_)
        | ClientRequest::DiscoverRequest(_) => Rule::Gateway,
        ClientRequest::ListToolsRequest(_)
        | ClientRequest::ListPromptsRequest(_)
        | ClientRequest::ListResourcesRequest(_)
        | ClientRequest::ListResourceTemplatesRequest(_) => Rule::Listing,
        ClientRequest::CallToolRequest(_) => Rule::ToolCall,
        ClientRequest::GetPromptRequest(_) => Rule::Prompt,
        ClientRequest::ReadResourceRequest(_) => Rule::Resource,
        ClientRequest::CompleteRequest(_) => Rule::Completion,
        ClientRequest::SubscribeRequest(_)
        | ClientRequest::UnsubscribeRequest(_)
        | ClientRequest::SubscriptionsListenRequest(_) => Rule::Subscription,
        ClientRequest::SetLevelRequest(_) => Rule::OwnLogLevel,
        ClientRequest::GetTaskRequest(_)
        | ClientRequest::UpdateTaskRequest(_)
        | ClientRequest::CancelTaskRequest(_) => Rule::Task,
        ClientRequest::ListSkillsRequest(_)
        | ClientRequest::GetSkillRequest(_)
        | ClientRequest::ReadResourceDirectoryRequest(_)
        | ClientRequest::CustomRequest(_) => Rule::Refused,
        _ => Rule::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{ClientRequest, Rule, rule};

    fn request(method: &str, params: Value) -> ClientRequest {
        serde_json::from_value(json!({ "method": method, "params": params }))
            .unwrap_or_else(|e| panic!("{method}: {e}"))
    }

    /// Every kind rmcp 3.11 has, built from the wire, and its rule. A kind
    /// missing here shows up as `Rule::Unknown` in `rule`.
    #[test]
    fn every_request_kind_has_a_rule() {
        let meta = json!({ "_meta": {} });
        let table = [
            ("ping", json!({}), Rule::Gateway),
            (
                "initialize",
                json!({"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}),
                Rule::Gateway,
            ),
            ("server/discover", meta.clone(), Rule::Gateway),
            ("tools/list", json!({}), Rule::Listing),
            ("prompts/list", json!({}), Rule::Listing),
            ("resources/list", json!({}), Rule::Listing),
            ("resources/templates/list", json!({}), Rule::Listing),
            ("tools/call", json!({"name": "t"}), Rule::ToolCall),
            ("prompts/get", json!({"name": "p"}), Rule::Prompt),
            ("resources/read", json!({"uri": "a://b"}), Rule::Resource),
            (
                "completion/complete",
                json!({"ref": {"type": "ref/prompt", "name": "p"},
                       "argument": {"name": "a", "value": "v"}}),
                Rule::Completion,
            ),
            (
                "resources/subscribe",
                json!({"uri": "a://b"}),
                Rule::Subscription,
            ),
            (
                "resources/unsubscribe",
                json!({"uri": "a://b"}),
                Rule::Subscription,
            ),
            (
                "subscriptions/listen",
                json!({"notifications": {}}),
                Rule::Subscription,
            ),
            (
                "logging/setLevel",
                json!({"level": "debug"}),
                Rule::OwnLogLevel,
            ),
            ("tasks/get", json!({"taskId": "t"}), Rule::Task),
            (
                "tasks/update",
                json!({"taskId": "t", "inputResponses": {}}),
                Rule::Task,
            ),
            ("tasks/cancel", json!({"taskId": "t"}), Rule::Task),
            ("tasks/list", json!({}), Rule::Refused),
            ("tasks/result", json!({"taskId": "t"}), Rule::Refused),
            ("skills/list", json!({}), Rule::Refused),
            (
                "skills/get",
                json!({"uri": "skill://a/SKILL.md"}),
                Rule::Refused,
            ),
            (
                "resources/directory/read",
                json!({"uri": "a://b/"}),
                Rule::Refused,
            ),
            ("x/anything", json!({}), Rule::Refused),
        ];
        for (method, params, want) in table {
            let parsed = request(method, params);
            assert_eq!(parsed.method(), method, "{method} parsed as another kind");
            assert_eq!(rule(&parsed), want, "{method}");
        }
    }
}
