//! Input schemas made acceptable to each API.
//!
//! Both APIs take a JSON Schema whose root is `type: "object"`. What each
//! refuses at the root is known from the errors they answer with (the
//! request schemas in `docs/provider-shapes/` cite them):
//! - Anthropic: "input_schema does not support oneOf, allOf, or anyOf at the
//!   top level";
//! - OpenAI: "schema must have type 'object' and not have
//!   'oneOf'/'anyOf'/'allOf'/'enum'/'not' at the top level", and an object
//!   schema without `properties` is refused.
//!
//! Below the root both accept what upstream MCP servers send, so nested
//! schemas pass through unchanged. Every change is reported.

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::Provider;

/// Root keywords each API refuses.
pub fn forbidden_root_keywords(provider: Provider) -> &'static [&'static str] {
    match provider {
        Provider::Anthropic => &["oneOf", "anyOf", "allOf"],
        Provider::OpenAi => &["oneOf", "anyOf", "allOf", "enum", "not"],
    }
}

/// One change made to a tool's schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SchemaChange {
    /// The qualified name of the tool.
    pub tool: String,
    /// A JSON pointer into the input schema as the upstream sent it.
    pub path: String,
    /// `dropped`, `replaced` or `added`.
    pub action: &'static str,
    pub reason: &'static str,
}

/// `schema` adapted for `provider`, and what was changed.
pub fn adapt(provider: Provider, qualified: &str, schema: &Value) -> (Value, Vec<SchemaChange>) {
    let mut changes = Vec::new();
    let mut change = |path: &str, action, reason| {
        changes.push(SchemaChange {
            tool: qualified.to_string(),
            path: path.to_string(),
            action,
            reason,
        })
    };
    let mut root: Map<String, Value> = match schema {
        Value::Object(map) => map.clone(),
        _ => {
            change("", "replaced", "the input schema is not an object");
            Map::new()
        }
    };
    for keyword in forbidden_root_keywords(provider) {
        if root.remove(*keyword).is_some() {
            change(
                &format!("/{keyword}"),
                "dropped",
                "not accepted at the root of a tool's input schema",
            );
        }
    }
    match root.get("type") {
        Some(Value::String(t)) if t == "object" => {}
        Some(_) => {
            root.insert("type".into(), json!("object"));
            change("/type", "replaced", "the root must be type \"object\"");
        }
        None => {
            root.insert("type".into(), json!("object"));
            change("/type", "added", "the root must be type \"object\"");
        }
    }
    if provider == Provider::OpenAi && !root.get("properties").is_some_and(Value::is_object) {
        let action = if root.contains_key("properties") {
            "replaced"
        } else {
            "added"
        };
        root.insert("properties".into(), json!({}));
        change("/properties", action, "an object schema needs properties");
    }
    (Value::Object(root), changes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_combinators_are_dropped_and_reported() {
        let schema =
            json!({"anyOf": [{"required": ["a"]}], "properties": {"a": {"type": "string"}}});
        let (out, changes) = adapt(Provider::Anthropic, "s__t", &schema);
        assert_eq!(
            out,
            json!({"properties": {"a": {"type": "string"}}, "type": "object"})
        );
        assert_eq!(changes.len(), 2);
        assert_eq!(changes[0].path, "/anyOf");
        let (out, changes) = adapt(
            Provider::OpenAi,
            "s__t",
            &json!({"type": "object", "not": {}}),
        );
        assert_eq!(out, json!({"type": "object", "properties": {}}));
        assert_eq!(changes.len(), 2);
    }

    #[test]
    fn nested_keywords_pass_through() {
        let schema =
            json!({"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}]}}});
        let (out, changes) = adapt(Provider::OpenAi, "s__t", &schema);
        assert_eq!(out, schema);
        assert!(changes.is_empty());
    }
}
