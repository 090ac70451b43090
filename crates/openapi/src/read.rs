//! A document's bytes into a JSON value, and which OpenAPI it is.

use serde_json::Value;

use crate::{DocumentError, Limits};

/// The OpenAPI versions a document may declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecVersion {
    /// 3.0.x: schemas are an extended subset of JSON Schema draft 4, turned
    /// into 2020-12 here.
    V3_0,
    /// 3.1.x: schemas are JSON Schema 2020-12 already.
    V3_1,
}

/// Parses `bytes` as JSON (when it starts with `{`) or YAML, and checks the
/// declared version.
pub(crate) fn read(
    bytes: &[u8],
    place: &str,
    limits: &Limits,
) -> Result<(Value, SpecVersion), DocumentError> {
    if bytes.len() > limits.max_document_bytes {
        return Err(too_large(place, limits));
    }
    let text = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let starts_as_json = text
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'{');
    let document: Value = if starts_as_json {
        serde_json::from_slice(text)
            .map_err(|e| DocumentError::new(place, format!("not valid JSON: {e}")))?
    } else {
        serde_norway::from_slice(text)
            .map_err(|e| DocumentError::new(place, format!("not valid YAML: {e}")))?
    };
    let version = version(&document, place)?;
    Ok((document, version))
}

pub(crate) fn too_large(place: &str, limits: &Limits) -> DocumentError {
    DocumentError::new(
        place,
        format!(
            "the document is larger than {} bytes (the limit)",
            limits.max_document_bytes
        ),
    )
}

fn version(document: &Value, place: &str) -> Result<SpecVersion, DocumentError> {
    let Some(object) = document.as_object() else {
        return Err(DocumentError::new(
            place,
            "not an OpenAPI document: the top level is not a mapping",
        ));
    };
    if object.contains_key("swagger") {
        return Err(DocumentError::new(
            place,
            "Swagger 2.0 documents are not supported; convert it to OpenAPI 3 first",
        ));
    }
    let declared = match object.get("openapi") {
        Some(Value::String(declared)) => declared.as_str(),
        Some(other) => {
            return Err(DocumentError::new(
                place,
                format!("`openapi` must be a version string such as \"3.1.0\", not {other}"),
            ));
        }
        None => {
            return Err(DocumentError::new(
                place,
                "not an OpenAPI document: no `openapi` version field",
            ));
        }
    };
    if declared.starts_with("3.0.") || declared == "3.0" {
        Ok(SpecVersion::V3_0)
    } else if declared.starts_with("3.1.") || declared == "3.1" {
        Ok(SpecVersion::V3_1)
    } else {
        Err(DocumentError::new(
            place,
            format!("OpenAPI {declared} is not supported; only 3.0 and 3.1 are"),
        ))
    }
}
