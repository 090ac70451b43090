//! The OpenAPI converter and caller against real documents and a real HTTP
//! server.

mod calls;
mod documents;
mod petstore;
mod requests;

use manifold_openapi::{Api, DocumentError, Limits};
use serde_json::Value;

/// `document` (a JSON value) parsed with `limits`.
fn parse_with(document: &Value, limits: &Limits) -> Result<Api, DocumentError> {
    Api::parse(document.to_string().as_bytes(), "test.json", limits)
}

fn parse(document: &Value) -> Api {
    parse_with(document, &Limits::default()).expect("the document parses")
}

/// A 3.0 document with the given paths and schemas.
fn document(paths: Value, schemas: Value) -> Value {
    serde_json::json!({
        "openapi": "3.0.3",
        "info": { "title": "t", "version": "1" },
        "paths": paths,
        "components": { "schemas": schemas },
    })
}
