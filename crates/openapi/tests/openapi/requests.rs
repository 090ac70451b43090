//! A call's arguments into the request: the path cannot be changed by a
//! value, headers cannot be smuggled, and the operator's credentials win.

use http::{HeaderMap, HeaderValue};
use manifold_openapi::{Operation, PreparedRequest, Target};
use reqwest::Url;
use serde_json::{Value, json};

use super::{document, parse};

fn operation() -> Operation {
    let doc = document(
        json!({ "/files/{name}/v{version}": { "post": {
            "operationId": "upload",
            "parameters": [
                { "name": "name", "in": "path", "required": true, "schema": { "type": "string" } },
                { "name": "version", "in": "path", "required": true, "schema": { "type": "integer" } },
                { "name": "tags", "in": "query", "schema": { "type": "array" } },
                { "name": "ids", "in": "query", "explode": false, "schema": { "type": "array" } },
                { "name": "filter", "in": "query", "style": "deepObject", "schema": { "type": "object" } },
                { "name": "api_key", "in": "query", "schema": { "type": "string" } },
                { "name": "X-Trace", "in": "header", "schema": { "type": "string" } },
                { "name": "X-Tenant", "in": "header", "schema": { "type": "string" } },
            ],
            "requestBody": { "content": { "application/json": { "schema": { "type": "object" } } } },
        } } }),
        json!({}),
    );
    parse(&doc).operations.remove(0)
}

fn target() -> Target {
    let mut headers = HeaderMap::new();
    headers.insert("x-tenant", HeaderValue::from_static("operators"));
    Target {
        base: Url::parse("https://api.example.com/base/?fixed=1").unwrap(),
        headers,
        query: vec![("api_key".into(), "secret".into())],
    }
}

fn prepare(arguments: Value) -> Result<PreparedRequest, String> {
    operation().prepare(&target(), arguments.as_object().unwrap())
}

#[test]
fn a_call_becomes_its_request() {
    let request = prepare(json!({
        "name": "report 1.pdf",
        "version": 3,
        "tags": ["a", "b&c"],
        "ids": [1, 2],
        "filter": { "color": "red" },
        "api_key": "the caller's",
        "X-Trace": "t-1",
        "X-Tenant": "the caller's",
        "body": { "x": [1] },
    }))
    .unwrap();
    assert_eq!(request.method, http::Method::POST);
    assert_eq!(
        request.url.as_str(),
        "https://api.example.com/base/files/report%201.pdf/v3?fixed=1&tags=a&tags=b%26c&ids=1%2C2&filter%5Bcolor%5D=red&api_key=secret"
    );
    assert_eq!(request.headers["x-trace"], "t-1");
    assert_eq!(request.headers["x-tenant"], "operators");
    assert_eq!(request.headers["content-type"], "application/json");
    assert_eq!(request.body.as_deref(), Some(&br#"{"x":[1]}"#[..]));
}

#[test]
fn a_path_parameter_cannot_change_the_path() {
    for (name, expected) in [
        ("../../admin", "/base/files/..%2F..%2Fadmin/v1"),
        ("a/b", "/base/files/a%2Fb/v1"),
        ("%2e%2e", "/base/files/%252e%252e/v1"),
        ("?x=1#f", "/base/files/%3Fx%3D1%23f/v1"),
    ] {
        let request = prepare(json!({ "name": name, "version": 1 })).unwrap();
        assert_eq!(request.url.path(), expected, "{name}");
        assert_eq!(
            request.url.query(),
            Some("fixed=1&api_key=secret"),
            "{name}"
        );
    }
    for name in ["..", ".", ""] {
        let error = prepare(json!({ "name": name, "version": 1 })).unwrap_err();
        assert!(
            error.contains("cannot be empty, \".\" or \"..\""),
            "{name}: {error}"
        );
    }
    let error = prepare(json!({ "version": 1 })).unwrap_err();
    assert_eq!(error, "argument \"name\" is required");
}

#[test]
fn a_header_parameter_cannot_carry_cr_or_lf() {
    for value in ["a\r\nAuthorization: Bearer x", "a\nb", "a\rb"] {
        let error = prepare(json!({ "name": "n", "version": 1, "X-Trace": value })).unwrap_err();
        assert_eq!(error, "argument \"X-Trace\" cannot contain CR or LF");
    }
    let error = prepare(json!({ "name": "n", "version": 1, "X-Trace": "a\u{0}b" })).unwrap_err();
    assert!(
        error.contains("characters a header cannot carry"),
        "{error}"
    );
}

#[test]
fn absent_and_null_arguments_are_left_out() {
    let request = prepare(json!({ "name": "n", "version": 1, "tags": null })).unwrap();
    assert_eq!(request.url.query(), Some("fixed=1&api_key=secret"));
    assert!(request.body.is_none());
    assert!(!request.headers.contains_key("content-type"));
    assert!(!request.headers.contains_key("x-trace"));
}
