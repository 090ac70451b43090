//! The request headers a plain call sends, as far as they depend on the
//! tool: `Mcp-Name`, and whether rmcp must build `Mcp-Param-*` headers.

use std::{collections::HashSet, sync::RwLock};

use http::HeaderValue;
use rmcp::model::{JsonObject, Tool};
use serde_json::Value;

/// Tools whose input schema asks for `Mcp-Param-*` headers (SEP-2243
/// `x-mcp-header`): rmcp builds those, so their calls stay on rmcp. Names
/// are only added: listings cached per caller may each show a different
/// part of the server, and none of them may take a name off.
#[derive(Default)]
pub(crate) struct ParamHeaderTools(RwLock<HashSet<String>>);

impl ParamHeaderTools {
    pub(crate) fn learn(&self, tools: &[Tool]) {
        let mut annotated = tools
            .iter()
            .filter(|tool| names_param_headers(&tool.input_schema))
            .peekable();
        if annotated.peek().is_none() {
            return;
        }
        let mut names = self.0.write().unwrap_or_else(|p| p.into_inner());
        names.extend(annotated.map(|tool| tool.name.to_string()));
    }

    pub(super) fn contains(&self, name: &str) -> bool {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(name)
    }
}

fn names_param_headers(schema: &JsonObject) -> bool {
    schema.iter().any(|(key, value)| {
        key == "x-mcp-header"
            || match value {
                Value::Object(map) => names_param_headers(map),
                Value::Array(items) => items
                    .iter()
                    .any(|item| item.as_object().is_some_and(names_param_headers)),
                _ => false,
            }
    })
}

/// A name that goes into `Mcp-Name` as it is: visible ASCII with no
/// surrounding blanks and nothing that looks like the Base64 form. Other
/// names are rmcp's to encode.
pub(super) fn plain_header_value(name: &str) -> Option<HeaderValue> {
    let plain = !name.is_empty()
        && name.bytes().all(|b| (0x21..=0x7e).contains(&b))
        && !name.starts_with("=?");
    plain.then(|| HeaderValue::from_str(name).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn param_header_annotations_are_found_at_any_depth() {
        let plain = json!({"type": "object", "properties": {"q": {"type": "string"}}});
        let annotated = json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"}}});
        let in_a_list = json!({"type": "object", "anyOf": [
            {"properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}]});
        assert!(!names_param_headers(plain.as_object().unwrap()));
        assert!(names_param_headers(annotated.as_object().unwrap()));
        assert!(names_param_headers(in_a_list.as_object().unwrap()));
    }

    #[test]
    fn a_listing_without_an_annotated_tool_takes_no_name_off() {
        let tool = |name: &str, schema: Value| {
            Tool::new(
                name.to_string(),
                "",
                std::sync::Arc::new(schema.as_object().unwrap().clone()),
            )
        };
        let annotated = json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"}}});
        let tools = ParamHeaderTools::default();
        tools.learn(&[
            tool("routed", annotated),
            tool("plain", json!({"type": "object"})),
        ]);
        tools.learn(&[tool("plain", json!({"type": "object"}))]);
        assert!(tools.contains("routed"));
        assert!(!tools.contains("plain"));
    }

    #[test]
    fn only_plain_names_go_into_the_header_as_they_are() {
        assert!(plain_header_value("get_weather").is_some());
        assert!(plain_header_value("a.b-c/d").is_some());
        assert!(plain_header_value(" padded").is_none());
        assert!(plain_header_value("naïve").is_none());
        assert!(plain_header_value("=?base64?eA==?=").is_none());
        assert!(plain_header_value("").is_none());
    }
}
