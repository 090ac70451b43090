//! The playground's call form, generated from a tool's `inputSchema`: one
//! field per top-level property, read back into arguments, and the broker's
//! validation messages put next to the field they are about.
//!
//! The form does not validate: the broker does, with the same validator as
//! every other call. A value that does not parse as its field's type is sent
//! as the text it is, so the broker's message names the real problem. Only
//! a JSON field that is not JSON at all is refused here, since there is
//! nothing to send.

use std::{collections::BTreeMap, fmt::Write};

use serde_json::{Map, Value};

use super::html::esc;

/// Form field names are prefixed, so no property can collide with the
/// form's own `tool` field.
pub const PREFIX: &str = "arg.";
/// The one field of a tool whose schema lists no properties.
pub const RAW: &str = "raw_arguments";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Text,
    Choice(Vec<String>),
    Integer,
    Number,
    Boolean,
    Json,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    kind: Kind,
    required: bool,
    description: String,
}

/// The fields of a schema, in its order; empty when it lists no properties.
pub fn fields(schema: &Value) -> Vec<Field> {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(properties) = schema["properties"].as_object() else {
        return Vec::new();
    };
    properties
        .iter()
        .map(|(name, property)| Field {
            name: name.clone(),
            kind: kind_of(property),
            required: required.contains(&name.as_str()),
            description: property["description"].as_str().unwrap_or("").to_string(),
        })
        .collect()
}

fn kind_of(property: &Value) -> Kind {
    if let Some(options) = property["enum"].as_array()
        && options.iter().all(Value::is_string)
    {
        return Kind::Choice(
            options
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect(),
        );
    }
    match property["type"].as_str() {
        Some("string") => Kind::Text,
        Some("integer") => Kind::Integer,
        Some("number") => Kind::Number,
        Some("boolean") => Kind::Boolean,
        _ => Kind::Json,
    }
}

/// What the operator typed, by property (or [`RAW`]).
pub type Values = BTreeMap<String, String>;
/// Messages by property; `""` holds those about the whole call.
pub type Errors = BTreeMap<String, Vec<String>>;

/// The arguments the form's values stand for; an empty field is left out.
/// Errors only for JSON that does not parse.
pub fn arguments(fields: &[Field], values: &Values) -> Result<Map<String, Value>, Errors> {
    let mut out = Map::new();
    let mut errors = Errors::new();
    if fields.is_empty() {
        let raw = values.get(RAW).map(|s| s.trim()).unwrap_or("");
        if raw.is_empty() {
            return Ok(out);
        }
        return match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(map)) => Ok(map),
            Ok(_) => Err(one(RAW, "the arguments must be a JSON object")),
            Err(e) => Err(one(RAW, &format!("not valid JSON: {e}"))),
        };
    }
    for field in fields {
        let Some(text) = values.get(&field.name).filter(|v| !v.trim().is_empty()) else {
            continue;
        };
        let text = text.trim();
        let value = match &field.kind {
            Kind::Text | Kind::Choice(_) => Value::String(text.to_string()),
            Kind::Integer => text
                .parse::<i64>()
                .map(Value::from)
                .unwrap_or_else(|_| Value::String(text.to_string())),
            Kind::Number => text
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map(Value::Number)
                .unwrap_or_else(|| Value::String(text.to_string())),
            Kind::Boolean => match text {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                other => Value::String(other.to_string()),
            },
            Kind::Json => match serde_json::from_str(text) {
                Ok(value) => value,
                Err(e) => {
                    errors
                        .entry(field.name.clone())
                        .or_default()
                        .push(format!("not valid JSON: {e}"));
                    continue;
                }
            },
        };
        out.insert(field.name.clone(), value);
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

fn one(field: &str, message: &str) -> Errors {
    Errors::from([(field.to_string(), vec![message.to_string()])])
}

/// The broker's violations by the property they are about: `/count: …` is
/// about `count`, `"title" is a required property` about `title`; the rest
/// is about the whole call.
pub fn place(fields: &[Field], violations: &[String]) -> Errors {
    let mut errors = Errors::new();
    for violation in violations {
        let about = violation
            .strip_prefix('/')
            .and_then(|rest| rest.split(['/', ':']).next())
            .or_else(|| {
                violation
                    .strip_prefix('"')
                    .and_then(|rest| rest.split_once("\" is a required property"))
                    .map(|(name, _)| name)
            })
            .filter(|name| fields.iter().any(|f| f.name == *name))
            .unwrap_or(if fields.is_empty() { RAW } else { "" });
        errors
            .entry(about.to_string())
            .or_default()
            .push(violation.clone());
    }
    errors
}

fn messages(errors: &Errors, key: &str, id: &str) -> String {
    let Some(list) = errors.get(key).filter(|l| !l.is_empty()) else {
        return String::new();
    };
    let mut out = format!("<ul class=\"field-errors error\" id=\"{id}\" role=\"alert\">");
    for message in list {
        let _ = write!(out, "<li>{}</li>", esc(message));
    }
    out.push_str("</ul>");
    out
}

/// The form's fields, filled with `values`, each with its errors under it.
pub fn render(fields: &[Field], values: &Values, errors: &Errors) -> String {
    let mut out = messages(errors, "", "errors-call");
    if fields.is_empty() {
        let value = values.get(RAW).map(String::as_str).unwrap_or("");
        let _ = write!(
            out,
            "<label class=\"wide\">arguments (a JSON object)\
             <textarea name=\"{PREFIX}{RAW}\" rows=\"4\" placeholder=\"{{}}\">{}</textarea></label>{}",
            esc(value),
            messages(errors, RAW, &format!("errors-{RAW}"))
        );
        return out;
    }
    for field in fields {
        let name = format!("{PREFIX}{}", field.name);
        let value = values.get(&field.name).map(String::as_str).unwrap_or("");
        let invalid = if errors.contains_key(&field.name) {
            " aria-invalid=\"true\""
        } else {
            ""
        };
        let (kind, input) = match &field.kind {
            Kind::Text => (
                "string",
                format!(
                    "<input name=\"{}\" value=\"{}\"{invalid}>",
                    esc(&name),
                    esc(value)
                ),
            ),
            Kind::Integer | Kind::Number => (
                if field.kind == Kind::Integer {
                    "integer"
                } else {
                    "number"
                },
                format!(
                    "<input name=\"{}\" value=\"{}\" inputmode=\"decimal\"{invalid}>",
                    esc(&name),
                    esc(value)
                ),
            ),
            Kind::Choice(options) => {
                let mut select = format!(
                    "<select name=\"{}\"{invalid}><option value=\"\"></option>",
                    esc(&name)
                );
                for option in options {
                    let selected = if option == value { " selected" } else { "" };
                    let _ = write!(select, "<option{selected}>{}</option>", esc(option));
                }
                select.push_str("</select>");
                ("one of", select)
            }
            Kind::Boolean => {
                let mut select = format!("<select name=\"{}\"{invalid}>", esc(&name));
                for option in ["", "true", "false"] {
                    let selected = if option == value { " selected" } else { "" };
                    let _ = write!(select, "<option{selected}>{option}</option>");
                }
                select.push_str("</select>");
                ("boolean", select)
            }
            Kind::Json => (
                "JSON",
                format!(
                    "<textarea name=\"{}\" rows=\"3\"{invalid}>{}</textarea>",
                    esc(&name),
                    esc(value)
                ),
            ),
        };
        let required = if field.required { " *" } else { "" };
        let hint = if field.description.is_empty() {
            String::new()
        } else {
            format!("<span class=\"hint\">{}</span>", esc(&field.description))
        };
        let _ = write!(
            out,
            "<div class=\"field\" data-field=\"{}\"><label>{}{required} <span class=\"hint\">{kind}</span>{input}</label>{hint}{}</div>",
            esc(&field.name),
            esc(&field.name),
            messages(errors, &field.name, &format!("errors-{}", field.name))
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Where"},
                "max": {"type": "integer"},
                "mode": {"enum": ["fast", "slow"]},
                "dry": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["path"]
        })
    }

    fn values(pairs: &[(&str, &str)]) -> Values {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn values_become_typed_arguments_and_empty_fields_are_left_out() {
        let fields = fields(&schema());
        assert_eq!(fields.len(), 5);
        let args = arguments(
            &fields,
            &values(&[
                ("path", "/a"),
                ("max", "3"),
                ("dry", "true"),
                ("tags", "[\"x\"]"),
                ("mode", ""),
            ]),
        )
        .unwrap();
        assert_eq!(
            Value::Object(args),
            json!({"path": "/a", "max": 3, "dry": true, "tags": ["x"]})
        );
        // Not a number: sent as text, for the broker to explain.
        let args = arguments(&fields, &values(&[("max", "three")])).unwrap();
        assert_eq!(args["max"], "three");
        let errors = arguments(&fields, &values(&[("tags", "[x")])).unwrap_err();
        assert!(
            errors["tags"][0].starts_with("not valid JSON"),
            "{errors:?}"
        );
    }

    #[test]
    fn violations_go_next_to_their_field() {
        let fields = fields(&schema());
        let errors = place(
            &fields,
            &[
                "\"path\" is a required property".to_string(),
                "/max: \"three\" is not of type \"integer\"".to_string(),
                "something about the whole call".to_string(),
            ],
        );
        assert_eq!(errors["path"].len(), 1);
        assert_eq!(errors["max"].len(), 1);
        assert_eq!(errors[""].len(), 1);
        let html = render(&fields, &values(&[("max", "three")]), &errors);
        assert!(html.contains("id=\"errors-max\""), "{html}");
        assert!(html.contains("value=\"three\""), "{html}");
        assert!(html.contains("aria-invalid"), "{html}");
    }

    #[test]
    fn a_schema_without_properties_takes_raw_json() {
        let fields = fields(&json!({"type": "object"}));
        assert!(fields.is_empty());
        let args = arguments(&fields, &values(&[(RAW, "{\"a\": 1}")])).unwrap();
        assert_eq!(args["a"], 1);
        assert!(arguments(&fields, &values(&[(RAW, "[1]")])).is_err());
        assert!(render(&fields, &Values::new(), &Errors::new()).contains(RAW));
    }
}
