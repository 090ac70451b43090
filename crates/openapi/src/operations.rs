//! Each operation of a document as one tool, and what calling it sends.
//!
//! Arguments are named after the parameters. When two parameters in
//! different places share a name, the one met later (path, then query, then
//! header) is prefixed with its place (`query_id`); the JSON request body is
//! the argument `body`, or `request_body` when a parameter is called `body`.

use std::collections::HashSet;

use serde_json::{Map, Value, json};

use crate::{
    Api, DocumentError, Limits, Selection, SpecVersion,
    names::Names,
    schema::{Converter, deref},
};

/// The tier a method implies; an operator's classification overrides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    ReadOnly,
    Write,
    Destructive,
}

/// The tool an operation becomes.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    /// The operation's summary.
    pub title: Option<String>,
    pub description: String,
    pub input_schema: Map<String, Value>,
    /// From the first 2xx JSON response, when its schema is an object.
    pub output_schema: Option<Map<String, Value>>,
    pub tier: Tier,
}

/// Where a parameter goes in the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    Path,
    Query,
    Header,
}

impl Location {
    fn as_str(self) -> &'static str {
        match self {
            Location::Path => "path",
            Location::Query => "query",
            Location::Header => "header",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Parameter {
    /// Its name in the request.
    pub name: String,
    /// Its name among the tool's arguments.
    pub argument: String,
    pub location: Location,
    pub required: bool,
    /// Arrays and objects as repeated keys (`form`, exploded: the default).
    pub explode: bool,
    /// Objects as `name[key]=value`.
    pub deep_object: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BodyBinding {
    pub argument: String,
    pub required: bool,
    pub content_type: String,
}

/// One operation: its tool, and how a call becomes a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Operation {
    pub tool: ToolSpec,
    pub method: http::Method,
    /// The path template, `/pets/{petId}`.
    pub path: String,
    pub parameters: Vec<Parameter>,
    pub body: Option<BodyBinding>,
}

/// An operation left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// `METHOD /path`.
    pub operation: String,
    pub reason: String,
}

const METHODS: &[(&str, Tier)] = &[
    ("get", Tier::ReadOnly),
    ("put", Tier::Write),
    ("post", Tier::Write),
    ("delete", Tier::Destructive),
    ("options", Tier::ReadOnly),
    ("head", Tier::ReadOnly),
    ("patch", Tier::Write),
];

/// Headers an operation cannot take from a caller: OpenAPI says the first
/// three are ignored as parameters, the rest carry the gateway's
/// credentials or frame the request.
const RESERVED_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "authorization",
    "host",
    "cookie",
    "proxy-authorization",
    "content-length",
    "transfer-encoding",
    "connection",
    "te",
    "upgrade",
    "trailer",
    "keep-alive",
];

const MAX_DESCRIPTION_CHARS: usize = 4000;

pub(crate) fn build(
    document: &Value,
    version: SpecVersion,
    place: &str,
    limits: &Limits,
    selection: &Selection,
) -> Result<Api, DocumentError> {
    if limits.max_tool_name_len < 16 {
        return Err(DocumentError::new(
            place,
            "the server's name leaves too little room for tool names within 64 characters",
        ));
    }
    let paths = match document.get("paths") {
        None => &Map::new(),
        Some(Value::Object(paths)) => paths,
        Some(_) => return Err(DocumentError::new(place, "`paths` must be a mapping")),
    };
    let chosen = |path: &str, method: &str, operation: &Value| {
        let label = format!("{} {path}", method.to_ascii_uppercase());
        let id = operation.get("operationId").and_then(Value::as_str);
        selection.chooses(id, &label)
    };
    // Counted after path items' `$ref`s: many paths may share one item.
    let count: usize = paths
        .iter()
        .filter_map(|(path, item)| Some((path, deref(document, item).ok()?)))
        .map(|(path, item)| {
            METHODS
                .iter()
                .filter(|(method, _)| item.get(*method).is_some_and(|op| chosen(path, method, op)))
                .count()
        })
        .sum();
    if count > limits.max_operations {
        return Err(DocumentError::new(
            place,
            format!(
                "the document has {count} operations, more than the limit of {}",
                limits.max_operations
            ),
        ));
    }
    let mut builder = Builder {
        root: document,
        converter: Converter::new(
            document,
            version,
            limits.max_schema_nodes,
            limits.max_schema_depth,
        ),
        names: Names::new(limits.max_tool_name_len),
        nodes_left: limits.max_total_schema_nodes,
    };
    let mut operations = Vec::new();
    let mut skipped = Vec::new();
    for (path, item) in paths {
        let item = match deref(document, item) {
            Ok(item) => item,
            Err(reason) => {
                skipped.push(Skipped {
                    operation: path.clone(),
                    reason,
                });
                continue;
            }
        };
        for (method, tier) in METHODS {
            let Some(operation) = item.get(*method).filter(|op| chosen(path, method, op)) else {
                continue;
            };
            let label = format!("{} {path}", method.to_ascii_uppercase());
            match builder.operation(path, item, method, *tier, operation) {
                Ok(operation) => operations.push(operation),
                Err(reason) => skipped.push(Skipped {
                    operation: label,
                    reason,
                }),
            }
        }
    }
    let info = document.get("info");
    Ok(Api {
        version,
        title: info
            .and_then(|i| i.get("title"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        servers: document
            .get("servers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|s| s.get("url").and_then(Value::as_str))
            .map(str::to_string)
            .collect(),
        client_credentials_token_url: client_credentials_token_url(document),
        operations,
        skipped,
    })
}

fn client_credentials_token_url(document: &Value) -> Option<String> {
    let schemes = document
        .pointer("/components/securitySchemes")?
        .as_object()?;
    schemes.values().find_map(|scheme| {
        let scheme = deref(document, scheme).ok()?;
        (scheme.get("type")? == "oauth2")
            .then(|| {
                scheme
                    .pointer("/flows/clientCredentials/tokenUrl")?
                    .as_str()
            })
            .flatten()
            .map(str::to_string)
    })
}

struct Builder<'a> {
    root: &'a Value,
    converter: Converter<'a>,
    names: Names,
    nodes_left: usize,
}

impl Builder<'_> {
    fn operation(
        &mut self,
        path: &str,
        item: &Value,
        method: &str,
        tier: Tier,
        operation: &Value,
    ) -> Result<Operation, String> {
        if !operation.is_object() {
            return Err("an operation must be a mapping".into());
        }
        let mut properties = Map::new();
        let mut required = Vec::new();
        let mut taken = HashSet::new();
        let mut parameters = Vec::new();
        let declared = self.parameters(item, operation)?;
        for location in [Location::Path, Location::Query, Location::Header] {
            for (parameter, schema) in declared.iter().filter(|(p, _)| p.location == location) {
                let argument = unique(&mut taken, &parameter.name, location.as_str());
                if parameter.required {
                    required.push(Value::String(argument.clone()));
                }
                properties.insert(argument.clone(), schema.clone());
                parameters.push(Parameter {
                    argument,
                    ..parameter.clone()
                });
            }
        }
        // A `{name}` in the path that no parameter declares is still one.
        for name in template_names(path) {
            if !parameters
                .iter()
                .any(|p| p.location == Location::Path && p.name == name)
            {
                let argument = unique(&mut taken, name, "path");
                required.push(Value::String(argument.clone()));
                properties.insert(argument.clone(), json!({ "type": "string" }));
                parameters.push(Parameter {
                    name: name.to_string(),
                    argument,
                    location: Location::Path,
                    required: true,
                    explode: false,
                    deep_object: false,
                });
            }
        }
        let body = match self.body(operation)? {
            Some((schema, required_body, content_type)) => {
                let argument = if taken.contains("body") {
                    unique(&mut taken, "request_body", "request")
                } else {
                    unique(&mut taken, "body", "request")
                };
                if required_body {
                    required.push(Value::String(argument.clone()));
                }
                properties.insert(argument.clone(), schema);
                Some(BodyBinding {
                    argument,
                    required: required_body,
                    content_type,
                })
            }
            None => None,
        };
        let mut input_schema = Map::new();
        input_schema.insert("type".into(), "object".into());
        input_schema.insert("properties".into(), Value::Object(properties));
        if !required.is_empty() {
            input_schema.insert("required".into(), Value::Array(required));
        }
        input_schema.insert("additionalProperties".into(), false.into());
        let output_schema = self.output(operation);
        let text = |key: &str| {
            operation
                .get(key)
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|s| !s.is_empty())
        };
        let summary = text("summary");
        let description = match (summary, text("description")) {
            (Some(summary), Some(description)) if description != summary => {
                format!("{summary}\n\n{description}")
            }
            (Some(one), _) | (None, Some(one)) => one.to_string(),
            (None, None) => format!("{} {path}", method.to_ascii_uppercase()),
        };
        let name = self.names.name(text("operationId"), method, path);
        Ok(Operation {
            tool: ToolSpec {
                name,
                title: summary.map(str::to_string),
                description: description.chars().take(MAX_DESCRIPTION_CHARS).collect(),
                input_schema,
                output_schema,
                tier,
            },
            method: method
                .to_ascii_uppercase()
                .parse()
                .map_err(|_| "bad method")?,
            path: path.to_string(),
            parameters,
            body,
        })
    }

    /// A schema converted against the document's budget.
    fn convert(&mut self, schema: &Value) -> Result<Value, String> {
        let (converted, nodes) = self.converter.convert(schema)?;
        self.nodes_left = self.nodes_left.checked_sub(nodes).ok_or(
            "the document's schemas together expand past the limit (max_total_schema_nodes)",
        )?;
        Ok(converted)
    }

    /// The path item's parameters, overridden by the operation's, each with
    /// its converted schema; cookie parameters and reserved headers left
    /// out.
    fn parameters(
        &mut self,
        item: &Value,
        operation: &Value,
    ) -> Result<Vec<(Parameter, Value)>, String> {
        let mut merged: Vec<&Value> = Vec::new();
        for list in [item.get("parameters"), operation.get("parameters")] {
            let Some(list) = list else { continue };
            let list = list.as_array().ok_or("`parameters` must be a list")?;
            for parameter in list {
                let parameter = deref(self.root, parameter)?;
                let key = |p: &Value| (p.get("name").cloned(), p.get("in").cloned());
                merged.retain(|earlier| key(earlier) != key(parameter));
                merged.push(parameter);
            }
        }
        let mut out = Vec::new();
        for parameter in merged {
            let name = parameter
                .get("name")
                .and_then(Value::as_str)
                .ok_or("a parameter has no name")?;
            let required = parameter.get("required") == Some(&Value::Bool(true));
            let location = match parameter.get("in").and_then(Value::as_str) {
                Some("path") => Location::Path,
                Some("query") => Location::Query,
                Some("header") => {
                    let lower = name.to_ascii_lowercase();
                    if RESERVED_HEADERS.contains(&lower.as_str())
                        || http::HeaderName::from_bytes(name.as_bytes()).is_err()
                    {
                        continue;
                    }
                    Location::Header
                }
                Some("cookie") if required => {
                    return Err(format!(
                        "it needs the cookie parameter {name:?}, and cookies are not sent"
                    ));
                }
                Some("cookie") => continue,
                other => return Err(format!("parameter {name:?} is in {other:?}")),
            };
            let schema = match (parameter.get("schema"), parameter.get("content")) {
                (Some(schema), _) => self.convert(schema)?,
                (None, Some(content)) => match json_media(content) {
                    Some((_, media)) => match media.get("schema") {
                        Some(schema) => self.convert(schema)?,
                        None => json!({}),
                    },
                    None => json!({ "type": "string" }),
                },
                (None, None) => json!({ "type": "string" }),
            };
            let schema = describe(schema, parameter);
            let style = parameter.get("style").and_then(Value::as_str);
            let explode = parameter
                .get("explode")
                .and_then(Value::as_bool)
                .unwrap_or(matches!(style, None | Some("form")) && location == Location::Query);
            out.push((
                Parameter {
                    name: name.to_string(),
                    argument: String::new(),
                    location,
                    required: required || location == Location::Path,
                    explode,
                    deep_object: style == Some("deepObject"),
                },
                schema,
            ));
        }
        Ok(out)
    }

    /// The JSON request body's schema, whether it is required, and its
    /// media type. A body only in other media types is left out when
    /// optional and refuses the operation when required.
    fn body(&mut self, operation: &Value) -> Result<Option<(Value, bool, String)>, String> {
        let Some(body) = operation.get("requestBody") else {
            return Ok(None);
        };
        let body = deref(self.root, body)?;
        let required = body.get("required") == Some(&Value::Bool(true));
        let content = body.get("content").unwrap_or(&Value::Null);
        let Some((media_type, media)) = json_media(content) else {
            if required {
                let types: Vec<&String> = content
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, _)| k)
                    .collect();
                return Err(format!(
                    "its request body is {types:?}; only JSON bodies are sent"
                ));
            }
            return Ok(None);
        };
        let schema = match media.get("schema") {
            Some(schema) => self.convert(schema)?,
            None => json!({}),
        };
        Ok(Some((
            describe(schema, body),
            required,
            media_type.to_string(),
        )))
    }

    /// The schema of the first 2xx JSON response, when it describes an
    /// object (an MCP output schema must). One that cannot be converted is
    /// left out rather than costing the operation.
    fn output(&mut self, operation: &Value) -> Option<Map<String, Value>> {
        let responses = operation.get("responses")?.as_object()?;
        let (_, response) = responses
            .iter()
            .find(|(status, _)| status.starts_with('2'))?;
        let response = deref(self.root, response).ok()?;
        let (_, media) = json_media(response.get("content")?)?;
        let Value::Object(mut schema) = self.convert(media.get("schema")?).ok()? else {
            return None;
        };
        match schema.get("type") {
            Some(Value::String(t)) if t == "object" => Some(schema),
            None if schema.contains_key("properties") => {
                schema.insert("type".into(), "object".into());
                Some(schema)
            }
            _ => None,
        }
    }
}

/// `wanted` if free, else prefixed with `place`, else numbered.
fn unique(taken: &mut HashSet<String>, wanted: &str, place: &str) -> String {
    let mut name = wanted.to_string();
    if taken.contains(&name) {
        name = format!("{place}_{wanted}");
    }
    let stem = name.clone();
    let mut n = 2;
    while taken.contains(&name) {
        name = format!("{stem}_{n}");
        n += 1;
    }
    taken.insert(name.clone());
    name
}

/// The names between braces in a path template.
pub(crate) fn template_names(path: &str) -> impl Iterator<Item = &str> {
    path.split('{')
        .skip(1)
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
}

/// The first JSON media type of a `content` map.
fn json_media(content: &Value) -> Option<(&str, &Value)> {
    content.as_object()?.iter().find_map(|(media_type, media)| {
        let essence = media_type.split(';').next()?.trim().to_ascii_lowercase();
        (essence == "application/json" || essence.ends_with("+json"))
            .then_some((media_type.as_str(), media))
    })
}

/// `schema` with the parameter's or body's description when it has none.
fn describe(schema: Value, described: &Value) -> Value {
    let Some(description) = described.get("description").and_then(Value::as_str) else {
        return schema;
    };
    let deprecated = described.get("deprecated") == Some(&Value::Bool(true));
    match schema {
        Value::Object(mut map) => {
            map.entry("description")
                .or_insert_with(|| description.into());
            if deprecated {
                map.insert("deprecated".into(), true.into());
            }
            Value::Object(map)
        }
        Value::Bool(true) => json!({ "description": description }),
        other => other,
    }
}
