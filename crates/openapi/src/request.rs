//! A tool call's arguments as the HTTP request of its operation.
//!
//! Path parameters are percent-encoded, and the finished path must be the
//! one written: a value cannot add a segment or climb out with `..`. Header
//! parameters cannot carry CR or LF, and the operator's headers and query
//! parameters (credentials) win over a caller's of the same name.

use http::{HeaderMap, HeaderName, HeaderValue};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Url;
use serde_json::{Map, Value};

use crate::{Location, Operation, Parameter};

/// Everything but RFC 3986's unreserved characters is encoded in a path
/// segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Where an operation's requests go and what the operator adds to each.
#[derive(Debug, Clone)]
pub struct Target {
    /// Paths are appended to its path; its query is kept.
    pub base: Url,
    /// Sent with every request (an API key), over a caller's.
    pub headers: HeaderMap,
    /// Added to every request's query (an API key), over a caller's.
    pub query: Vec<(String, String)>,
}

/// A request ready to send.
#[derive(Debug, Clone)]
pub struct PreparedRequest {
    pub method: http::Method,
    pub url: Url,
    pub headers: HeaderMap,
    pub body: Option<Vec<u8>>,
}

impl Operation {
    /// The request a call with `arguments` stands for; an error says which
    /// argument is wrong.
    pub fn prepare(
        &self,
        target: &Target,
        arguments: &Map<String, Value>,
    ) -> Result<PreparedRequest, String> {
        let mut path = target.base.path().trim_end_matches('/').to_string();
        path.push_str(&self.fill_path(arguments)?);
        let mut url = target.base.clone();
        url.set_path(&path);
        if url.path() != path {
            return Err("a path parameter would change the request's path".into());
        }
        {
            let mut query = url.query_pairs_mut();
            let operators = |name: &str| target.query.iter().any(|(own, _)| own == name);
            for parameter in self.in_location(Location::Query) {
                let Some(value) = present(arguments, parameter) else {
                    continue;
                };
                for (name, value) in query_pairs(parameter, value) {
                    if !operators(&name) {
                        query.append_pair(&name, &value);
                    }
                }
            }
            for (name, value) in &target.query {
                query.append_pair(name, value);
            }
        }
        if url.query() == Some("") {
            url.set_query(None);
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::ACCEPT,
            HeaderValue::from_static("application/json, text/plain;q=0.9, */*;q=0.8"),
        );
        for parameter in self.in_location(Location::Header) {
            let Some(value) = present(arguments, parameter) else {
                continue;
            };
            let name = HeaderName::from_bytes(parameter.name.as_bytes())
                .map_err(|_| format!("{:?} is not a header name", parameter.name))?;
            if target.headers.contains_key(&name) {
                continue;
            }
            let text = joined(value, ",");
            if text.contains(['\r', '\n']) {
                return Err(format!(
                    "argument {:?} cannot contain CR or LF",
                    parameter.argument
                ));
            }
            let value = HeaderValue::from_str(&text).map_err(|_| {
                format!(
                    "argument {:?} has characters a header cannot carry",
                    parameter.argument
                )
            })?;
            headers.insert(name, value);
        }
        let mut body = None;
        if let Some(binding) = &self.body {
            match arguments.get(&binding.argument) {
                Some(value) => {
                    body = Some(serde_json::to_vec(value).map_err(|e| e.to_string())?);
                    let content_type = HeaderValue::from_str(&binding.content_type)
                        .unwrap_or(HeaderValue::from_static("application/json"));
                    headers.insert(http::header::CONTENT_TYPE, content_type);
                }
                None if binding.required => {
                    return Err(format!("argument {:?} is required", binding.argument));
                }
                None => {}
            }
        }
        for (name, value) in &target.headers {
            headers.insert(name, value.clone());
        }
        Ok(PreparedRequest {
            method: self.method.clone(),
            url,
            headers,
            body,
        })
    }

    fn in_location(&self, location: Location) -> impl Iterator<Item = &Parameter> {
        self.parameters
            .iter()
            .filter(move |p| p.location == location)
    }

    /// The path template with each `{name}` replaced by its encoded value.
    fn fill_path(&self, arguments: &Map<String, Value>) -> Result<String, String> {
        let mut out = String::with_capacity(self.path.len());
        let mut rest = self.path.as_str();
        while let Some(open) = rest.find('{') {
            let Some(close) = rest[open..].find('}') else {
                break;
            };
            out.push_str(&rest[..open]);
            let name = &rest[open + 1..open + close];
            let parameter = self
                .in_location(Location::Path)
                .find(|p| p.name == name)
                .ok_or_else(|| format!("path parameter {name:?} is not declared"))?;
            let value = present(arguments, parameter)
                .ok_or_else(|| format!("argument {:?} is required", parameter.argument))?;
            let text = joined(value, ",");
            if text.is_empty() || text == "." || text == ".." {
                return Err(format!(
                    "argument {:?} cannot be empty, \".\" or \"..\"",
                    parameter.argument
                ));
            }
            out.extend(utf8_percent_encode(&text, SEGMENT));
            rest = &rest[open + close + 1..];
        }
        out.push_str(rest);
        if !out.starts_with('/') {
            out.insert(0, '/');
        }
        Ok(out)
    }
}

fn present<'a>(arguments: &'a Map<String, Value>, parameter: &Parameter) -> Option<&'a Value> {
    arguments.get(&parameter.argument).filter(|v| !v.is_null())
}

/// A scalar as text: strings as they are, anything else as JSON.
fn scalar(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The `simple` style: arrays and objects as comma-separated lists.
fn joined(value: &Value, separator: &str) -> String {
    match value {
        Value::Array(items) => items.iter().map(scalar).collect::<Vec<_>>().join(separator),
        Value::Object(map) => map
            .iter()
            .flat_map(|(k, v)| [k.clone(), scalar(v)])
            .collect::<Vec<_>>()
            .join(separator),
        other => scalar(other),
    }
}

fn query_pairs(parameter: &Parameter, value: &Value) -> Vec<(String, String)> {
    let name = &parameter.name;
    match value {
        Value::Array(items) if parameter.explode => {
            items.iter().map(|v| (name.clone(), scalar(v))).collect()
        }
        Value::Object(map) if parameter.deep_object => map
            .iter()
            .map(|(k, v)| (format!("{name}[{k}]"), scalar(v)))
            .collect(),
        Value::Object(map) if parameter.explode => {
            map.iter().map(|(k, v)| (k.clone(), scalar(v))).collect()
        }
        other => vec![(name.clone(), joined(other, ","))],
    }
}
