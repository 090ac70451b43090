//! Schemas as tools need them: local `$ref`s expanded in place (a cycle is
//! cut where it closes), remote ones refused, and 3.0's dialect turned into
//! JSON Schema 2020-12. Every node produced counts against a budget, so a
//! document built to expand exponentially stops early.

use serde_json::{Map, Value, json};

use crate::SpecVersion;

/// Keywords whose value is one schema.
const ONE_SCHEMA: &[&str] = &[
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "additionalItems",
    "contentSchema",
    "items",
];
/// Keywords whose value is an array of schemas.
const SCHEMA_ARRAYS: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems"];
/// Keywords whose value maps names to schemas.
const SCHEMA_MAPS: &[&str] = &[
    "properties",
    "patternProperties",
    "dependentSchemas",
    "$defs",
    "definitions",
];
/// OpenAPI's own keywords, meaningless to a JSON Schema validator.
const OPENAPI_ONLY: &[&str] = &["discriminator", "xml", "externalDocs"];

/// How many `$ref`s to other `$ref`s are followed before giving up.
const MAX_REF_HOPS: usize = 32;

/// The value `reference` points at in `root`. Only references within the
/// document (`#/...`) are followed.
pub(crate) fn resolve<'a>(root: &'a Value, reference: &str) -> Result<&'a Value, String> {
    let Some(fragment) = reference.strip_prefix('#') else {
        return Err(format!(
            "remote $ref {reference:?} is not supported; only references within the document are"
        ));
    };
    let pointer = percent_encoding::percent_decode_str(fragment)
        .decode_utf8()
        .map_err(|_| format!("$ref {reference:?} is not valid UTF-8"))?;
    root.pointer(&pointer)
        .ok_or_else(|| format!("$ref {reference:?} points at nothing in the document"))
}

/// `value`, or what its `$ref` (and theirs) point at: for parameters,
/// request bodies, responses and path items.
pub(crate) fn deref<'a>(root: &'a Value, mut value: &'a Value) -> Result<&'a Value, String> {
    for _ in 0..MAX_REF_HOPS {
        match value.get("$ref") {
            Some(Value::String(reference)) => value = resolve(root, reference)?,
            Some(_) => return Err("$ref must be a string".into()),
            None => return Ok(value),
        }
    }
    Err(format!("more than {MAX_REF_HOPS} $refs in a row"))
}

/// Converts schemas of one document; [`Converter::convert`] starts a fresh
/// budget for each schema.
pub(crate) struct Converter<'a> {
    root: &'a Value,
    version: SpecVersion,
    max_nodes: usize,
    max_depth: usize,
    nodes: usize,
    /// The `$ref`s being expanded, outermost first: meeting one again closes
    /// a cycle.
    expanding: Vec<String>,
}

impl<'a> Converter<'a> {
    pub(crate) fn new(
        root: &'a Value,
        version: SpecVersion,
        max_nodes: usize,
        max_depth: usize,
    ) -> Self {
        Self {
            root,
            version,
            max_nodes,
            max_depth,
            nodes: 0,
            expanding: Vec::new(),
        }
    }

    /// `schema` as a self-contained JSON Schema 2020-12, and how many nodes
    /// it took.
    pub(crate) fn convert(&mut self, schema: &Value) -> Result<(Value, usize), String> {
        self.nodes = 0;
        self.expanding.clear();
        let converted = self.schema(schema, 0)?;
        Ok((converted, self.nodes))
    }

    fn count(&mut self, depth: usize) -> Result<(), String> {
        self.nodes += 1;
        if self.nodes > self.max_nodes {
            return Err(format!(
                "a schema expands to more than {} nodes (the limit)",
                self.max_nodes
            ));
        }
        if depth > self.max_depth {
            return Err(format!(
                "a schema nests more than {} levels deep (the limit)",
                self.max_depth
            ));
        }
        Ok(())
    }

    fn schema(&mut self, schema: &Value, depth: usize) -> Result<Value, String> {
        self.count(depth)?;
        let map = match schema {
            Value::Bool(accepts) => return Ok(Value::Bool(*accepts)),
            Value::Object(map) => map,
            other => {
                return Err(format!(
                    "a schema must be an object or a boolean, not {other}"
                ));
            }
        };
        let Some(reference) = map.get("$ref") else {
            return self.object(map, depth);
        };
        let reference = reference.as_str().ok_or("$ref must be a string")?;
        let expanded = if self.expanding.iter().any(|open| open == reference) {
            cut(reference)
        } else {
            let target = resolve(self.root, reference)?;
            self.expanding.push(reference.to_string());
            let expanded = self.schema(target, depth + 1);
            self.expanding.pop();
            expanded?
        };
        // 3.0 ignores a `$ref`'s siblings; in 3.1 they apply beside it.
        let siblings = map.keys().any(|k| k != "$ref");
        if self.version == SpecVersion::V3_0 || !siblings {
            return Ok(expanded);
        }
        let mut rest = map.clone();
        rest.remove("$ref");
        let Value::Object(mut beside) = self.object(&rest, depth)? else {
            return Ok(expanded);
        };
        beside.insert("allOf".into(), Value::Array(vec![expanded]));
        Ok(Value::Object(beside))
    }

    fn object(&mut self, map: &Map<String, Value>, depth: usize) -> Result<Value, String> {
        let from_3_0 = self.version == SpecVersion::V3_0;
        let mut out = Map::new();
        for (key, value) in map {
            let key = key.as_str();
            if key.starts_with("x-") || OPENAPI_ONLY.contains(&key) {
                continue;
            }
            if from_3_0 && matches!(key, "nullable" | "example") {
                continue;
            }
            let converted = if ONE_SCHEMA.contains(&key) {
                match value {
                    // 3.0 `items` may not be an array, but a draft-4 tuple
                    // means `prefixItems`.
                    Value::Array(items) if key == "items" => {
                        let items = self.schemas(items, depth)?;
                        out.insert("prefixItems".into(), items);
                        continue;
                    }
                    _ => self.schema(value, depth + 1)?,
                }
            } else if SCHEMA_ARRAYS.contains(&key) {
                let Value::Array(items) = value else {
                    return Err(format!("`{key}` must be an array of schemas"));
                };
                self.schemas(items, depth)?
            } else if SCHEMA_MAPS.contains(&key) {
                let Value::Object(entries) = value else {
                    return Err(format!("`{key}` must map names to schemas"));
                };
                let mut converted = Map::new();
                for (name, schema) in entries {
                    converted.insert(name.clone(), self.schema(schema, depth + 1)?);
                }
                Value::Object(converted)
            } else {
                self.copy(value, depth + 1)?
            };
            out.insert(key.to_string(), converted);
        }
        if from_3_0 {
            three_oh_to_2020_12(map, &mut out);
        }
        Ok(Value::Object(out))
    }

    fn schemas(&mut self, items: &[Value], depth: usize) -> Result<Value, String> {
        items
            .iter()
            .map(|item| self.schema(item, depth + 1))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array)
    }

    /// A keyword's value (an `enum`, a `default`), counted like a schema.
    fn copy(&mut self, value: &Value, depth: usize) -> Result<Value, String> {
        self.count(depth)?;
        Ok(match value {
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|item| self.copy(item, depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Object(map) => {
                let mut out = Map::new();
                for (key, item) in map {
                    out.insert(key.clone(), self.copy(item, depth + 1)?);
                }
                Value::Object(out)
            }
            scalar => scalar.clone(),
        })
    }
}

/// What a `$ref` that closes a cycle becomes: any value, said so.
fn cut(reference: &str) -> Value {
    json!({ "description": format!("recursive reference to {reference}, not expanded") })
}

/// 3.0's departures from 2020-12, on a schema whose other keywords are
/// already converted: boolean `exclusiveMinimum`/`exclusiveMaximum`,
/// `nullable`, and `example`.
fn three_oh_to_2020_12(original: &Map<String, Value>, out: &mut Map<String, Value>) {
    for (exclusive, bound) in [
        ("exclusiveMinimum", "minimum"),
        ("exclusiveMaximum", "maximum"),
    ] {
        if let Some(Value::Bool(is_exclusive)) = original.get(exclusive) {
            out.remove(exclusive);
            if *is_exclusive && let Some(limit) = out.remove(bound) {
                out.insert(exclusive.into(), limit);
            }
        }
    }
    if let Some(example) = original.get("example") {
        out.entry("examples")
            .or_insert_with(|| Value::Array(vec![example.clone()]));
    }
    if original.get("nullable") != Some(&Value::Bool(true)) {
        return;
    }
    if let Some(Value::Array(options)) = out.get_mut("enum")
        && !options.contains(&Value::Null)
    {
        options.push(Value::Null);
    }
    match out.get_mut("type") {
        Some(Value::String(single)) => {
            let single = std::mem::take(single);
            out.insert("type".into(), json!([single, "null"]));
        }
        Some(Value::Array(types)) => {
            if !types.iter().any(|t| t == "null") {
                types.push("null".into());
            }
        }
        _ => {
            // No type to widen (`allOf`, `oneOf`, a `$ref`): either this
            // or null.
            let inner = std::mem::take(out);
            out.insert(
                "anyOf".into(),
                json!([Value::Object(inner), { "type": "null" }]),
            );
        }
    }
}
