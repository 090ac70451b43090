//! Reading documents: refusals that name the place, 3.0 into 2020-12,
//! `$ref`s, argument names, and hostile documents that stay bounded.

use manifold_openapi::{Api, Limits, Location, SpecVersion, Tier};
use serde_json::{Value, json};

use super::{document, parse, parse_with};

fn refusal(bytes: &str, place: &str) -> String {
    Api::parse(bytes.as_bytes(), place, &Limits::default())
        .expect_err("the document is refused")
        .to_string()
}

#[test]
fn swagger_2_and_unreadable_documents_are_refused_naming_the_place() {
    let swagger = refusal(
        "swagger: \"2.0\"\ninfo: {title: t}\npaths: {}\n",
        "old.yaml",
    );
    assert!(swagger.starts_with("old.yaml: Swagger 2.0"), "{swagger}");
    let json = refusal("{\"openapi\": \"3.0.0\",", "broken.json");
    assert!(json.starts_with("broken.json: not valid JSON"), "{json}");
    assert!(json.contains("line 1"), "{json}");
    let yaml = refusal("openapi: 3.0.0\npaths: [unclosed\n", "broken.yaml");
    assert!(yaml.starts_with("broken.yaml: not valid YAML"), "{yaml}");
    for (text, expected) in [
        ("[1, 2]", "top level is not a mapping"),
        ("title: no version\n", "no `openapi` version field"),
        ("openapi: 3\n", "must be a version string"),
        ("openapi: \"2.0\"\n", "OpenAPI 2.0 is not supported"),
        ("openapi: \"4.0.0\"\n", "OpenAPI 4.0.0 is not supported"),
        (
            "openapi: \"3.1.0\"\npaths: 5\n",
            "`paths` must be a mapping",
        ),
        ("", "top level is not a mapping"),
    ] {
        let error = refusal(text, "doc.yaml");
        assert!(
            error.starts_with("doc.yaml: ") && error.contains(expected),
            "{text:?}: {error}"
        );
    }
}

#[test]
fn a_document_over_the_size_limit_is_refused() {
    let limits = Limits {
        max_document_bytes: 100,
        ..Limits::default()
    };
    let big = format!(
        "openapi: \"3.1.0\"\ninfo: {{title: \"{}\"}}\n",
        "x".repeat(200)
    );
    let error = Api::parse(big.as_bytes(), "big.yaml", &limits).unwrap_err();
    assert!(
        error.to_string().contains("larger than 100 bytes"),
        "{error}"
    );
}

/// Odd shapes anywhere cost the operation they are in, never a panic.
#[test]
fn malformed_operations_are_skipped_with_a_reason() {
    let doc = document(
        json!({
            "/a": { "get": "not an operation" },
            "/b": { "get": { "parameters": 7 } },
            "/c": { "get": { "parameters": [{ "in": "query" }] } },
            "/d": { "get": { "parameters": [{ "name": "x", "in": "query", "schema": 5 }] } },
            "/e": { "post": { "requestBody": { "$ref": "#/nowhere" } } },
            "/f": { "get": { "parameters": [{ "name": "s", "in": "cookie", "required": true }] } },
            "/g": { "post": { "requestBody": { "required": true,
                "content": { "multipart/form-data": { "schema": { "type": "object" } } } } } },
            "/h": { "get": { "parameters": [{ "name": "x", "in": "body" }] } },
            "/ok": { "get": { "responses": { "200": 5 } } },
        }),
        json!({}),
    );
    let api = parse(&doc);
    let names: Vec<&str> = api
        .operations
        .iter()
        .map(|o| o.tool.name.as_str())
        .collect();
    assert_eq!(names, ["get_ok"]);
    let reasons: Vec<String> = api
        .skipped
        .iter()
        .map(|s| format!("{}: {}", s.operation, s.reason))
        .collect();
    let expected = [
        "GET /a: an operation must be a mapping",
        "GET /b: `parameters` must be a list",
        "GET /c: a parameter has no name",
        "GET /d: a schema must be an object or a boolean, not 5",
        "POST /e: $ref \"#/nowhere\" points at nothing in the document",
        "GET /f: it needs the cookie parameter \"s\", and cookies are not sent",
        "POST /g: its request body is [\"multipart/form-data\"]; only JSON bodies are sent",
        "GET /h: parameter \"x\" is in Some(\"body\")",
    ];
    assert_eq!(reasons, expected);
}

#[test]
fn three_oh_schemas_become_json_schema_2020_12() {
    let doc = document(
        json!({ "/t": { "post": {
            "operationId": "convert",
            "requestBody": { "required": true, "content": { "application/json": {
                "schema": { "$ref": "#/components/schemas/Thing" } } } },
        } } }),
        json!({
            "Thing": {
                "type": "object",
                "x-internal": true,
                "discriminator": { "propertyName": "kind" },
                "properties": {
                    "nullable": { "type": "string", "nullable": true, "example": "a" },
                    "range": { "type": "number", "minimum": 0, "exclusiveMinimum": true,
                               "maximum": 10, "exclusiveMaximum": false },
                    "choice": { "type": "string", "enum": ["a", "b"], "nullable": true },
                    "either": { "allOf": [{ "$ref": "#/components/schemas/Small" }],
                                "nullable": true },
                    "$ref": { "type": "string", "description": "a property named $ref" },
                },
            },
            "Small": { "type": "integer" },
        }),
    );
    let api = parse(&doc);
    assert_eq!(api.version, SpecVersion::V3_0);
    let body = &api.operations[0].tool.input_schema["properties"]["body"];
    assert_eq!(
        body,
        &json!({
            "type": "object",
            "properties": {
                "nullable": { "type": ["string", "null"], "examples": ["a"] },
                "range": { "type": "number", "exclusiveMinimum": 0, "maximum": 10 },
                "choice": { "type": ["string", "null"], "enum": ["a", "b", null] },
                "either": { "anyOf": [{ "allOf": [{ "type": "integer" }] }, { "type": "null" }] },
                "$ref": { "type": "string", "description": "a property named $ref" },
            },
        })
    );
    assert_eq!(
        api.operations[0].tool.input_schema["required"],
        json!(["body"])
    );
}

#[test]
fn three_one_schemas_pass_through_with_ref_siblings_applied() {
    let doc = json!({
        "openapi": "3.1.0",
        "info": { "title": "t", "version": "1" },
        "paths": { "/t": { "get": {
            "operationId": "get",
            "parameters": [{ "name": "q", "in": "query", "schema": {
                "$ref": "#/components/schemas/Q", "description": "beside the ref" } }],
            "responses": { "200": { "description": "ok", "content": {
                "application/json": { "schema": { "$ref": "#/components/schemas/Out" } } } } },
        } } },
        "components": { "schemas": {
            "Q": { "type": ["string", "null"], "exclusiveMinimum": 3 },
            "Out": { "type": "object", "properties": { "n": { "type": "integer" } } },
        } },
    });
    let api = parse(&doc);
    assert_eq!(api.version, SpecVersion::V3_1);
    let tool = &api.operations[0].tool;
    assert_eq!(
        tool.input_schema["properties"]["q"],
        json!({ "description": "beside the ref",
                "allOf": [{ "type": ["string", "null"], "exclusiveMinimum": 3 }] })
    );
    assert_eq!(
        Value::Object(tool.output_schema.clone().unwrap()),
        json!({ "type": "object", "properties": { "n": { "type": "integer" } } })
    );
}

#[test]
fn a_ref_cycle_is_cut_where_it_closes() {
    let doc = document(
        json!({ "/tree": { "get": {
            "operationId": "tree",
            "responses": { "200": { "description": "ok", "content": { "application/json": {
                "schema": { "$ref": "#/components/schemas/Node" } } } } },
        } } }),
        json!({ "Node": { "type": "object", "properties": {
            "children": { "type": "array", "items": { "$ref": "#/components/schemas/Node" } },
        } } }),
    );
    let api = parse(&doc);
    let output = Value::Object(api.operations[0].tool.output_schema.clone().unwrap());
    assert_eq!(
        output["properties"]["children"]["items"],
        json!({ "description": "recursive reference to #/components/schemas/Node, not expanded" })
    );
}

#[test]
fn remote_refs_are_refused() {
    let doc = document(
        json!({ "/r": { "post": {
            "requestBody": { "content": { "application/json": {
                "schema": { "$ref": "https://example.com/schemas/thing.json" } } } },
        } } }),
        json!({}),
    );
    let api = parse(&doc);
    assert!(api.operations.is_empty());
    assert_eq!(
        api.skipped[0].reason,
        "remote $ref \"https://example.com/schemas/thing.json\" is not supported; only references within the document are"
    );
}

#[test]
fn arguments_come_from_every_place_and_clashes_are_renamed() {
    let doc = document(
        json!({ "/items/{id}": {
            "parameters": [{ "name": "id", "in": "path", "required": true,
                             "schema": { "type": "integer" } }],
            "put": {
                "operationId": "updateItem",
                "summary": "Update an item",
                "description": "Replaces the item.",
                "parameters": [
                    { "name": "id", "in": "query", "schema": { "type": "string" } },
                    { "name": "body", "in": "query", "schema": { "type": "string" } },
                    { "name": "X-Trace", "in": "header", "description": "trace id",
                      "schema": { "type": "string" } },
                    { "name": "Authorization", "in": "header", "schema": { "type": "string" } },
                    { "name": "Host", "in": "header", "schema": { "type": "string" } },
                    { "name": "session", "in": "cookie", "schema": { "type": "string" } },
                ],
                "requestBody": { "required": true, "content": {
                    "application/merge-patch+json": { "schema": { "type": "object" } } } },
            },
            "delete": {},
            "head": {},
        } }),
        json!({}),
    );
    let api = parse(&doc);
    let update = api.operation("updateItem").unwrap();
    assert_eq!(
        update.tool.description,
        "Update an item\n\nReplaces the item."
    );
    assert_eq!(update.tool.title.as_deref(), Some("Update an item"));
    assert_eq!(update.tool.tier, Tier::Write);
    assert_eq!(
        Value::Object(update.tool.input_schema.clone()),
        json!({
            "type": "object",
            "properties": {
                "id": { "type": "integer" },
                "query_id": { "type": "string" },
                "body": { "type": "string" },
                "X-Trace": { "type": "string", "description": "trace id" },
                "request_body": { "type": "object" },
            },
            "required": ["id", "request_body"],
            "additionalProperties": false,
        })
    );
    let places: Vec<(&str, &str, Location)> = update
        .parameters
        .iter()
        .map(|p| (p.name.as_str(), p.argument.as_str(), p.location))
        .collect();
    assert_eq!(
        places,
        [
            ("id", "id", Location::Path),
            ("id", "query_id", Location::Query),
            ("body", "body", Location::Query),
            ("X-Trace", "X-Trace", Location::Header),
        ]
    );
    let body = update.body.as_ref().unwrap();
    assert_eq!(body.argument, "request_body");
    assert_eq!(body.content_type, "application/merge-patch+json");
    let tiers: Vec<(&str, Tier)> = api
        .operations
        .iter()
        .map(|o| (o.tool.name.as_str(), o.tool.tier))
        .collect();
    assert_eq!(
        tiers,
        [
            ("updateItem", Tier::Write),
            ("delete_items_id", Tier::Destructive),
            ("head_items_id", Tier::ReadOnly),
        ]
    );
}

#[test]
fn tool_names_fit_the_room_the_server_name_leaves() {
    let long_id = "a".repeat(100);
    let doc = document(
        json!({
            "/one": { "get": { "operationId": long_id } },
            "/two": { "get": { "operationId": long_id } },
        }),
        json!({}),
    );
    let limits = Limits {
        max_tool_name_len: 30,
        ..Limits::default()
    };
    let api = parse_with(&doc, &limits).unwrap();
    let names: Vec<&str> = api
        .operations
        .iter()
        .map(|o| o.tool.name.as_str())
        .collect();
    assert_eq!(names.len(), 2);
    assert!(names.iter().all(|n| n.len() <= 30), "{names:?}");
    assert_ne!(names[0], names[1]);
    let cramped = Limits {
        max_tool_name_len: 5,
        ..Limits::default()
    };
    assert!(parse_with(&doc, &cramped).is_err());
}

/// YAML's unquoted status codes are integers; they still count as 2xx.
#[test]
fn yaml_status_codes_without_quotes_are_read() {
    let yaml = "openapi: 3.0.0\ninfo: {title: t, version: '1'}\npaths:\n  /x:\n    get:\n      operationId: x\n      responses:\n        200:\n          description: ok\n          content:\n            application/json:\n              schema: {type: object, properties: {a: {type: string}}}\n";
    let api = Api::parse(yaml.as_bytes(), "x.yaml", &Limits::default()).unwrap();
    assert!(api.operations[0].tool.output_schema.is_some());
}

#[test]
fn a_yaml_alias_bomb_is_refused() {
    let mut yaml = String::from("openapi: 3.0.0\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let prev = i - 1;
        yaml.push_str(&format!(
            "a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
        ));
    }
    let error = Api::parse(yaml.as_bytes(), "bomb.yaml", &Limits::default()).unwrap_err();
    assert!(
        error.to_string().starts_with("bomb.yaml: not valid YAML"),
        "{error}"
    );
}

#[test]
fn ten_thousand_operations_are_refused_with_the_limit() {
    let paths: serde_json::Map<String, Value> = (0..10_000)
        .map(|i| (format!("/op{i}"), json!({ "get": {} })))
        .collect();
    let error = parse_with(
        &document(Value::Object(paths), json!({})),
        &Limits::default(),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        error,
        "test.json: the document has 10000 operations, more than the limit of 1000"
    );
}

/// Each schema refers to the next twice: expanded, it would have 2^40
/// nodes. The budget stops it, and only that operation is lost.
#[test]
fn an_exponential_schema_costs_only_its_operation() {
    let mut schemas = serde_json::Map::new();
    for i in 0..40 {
        let next = format!("#/components/schemas/S{}", i + 1);
        schemas.insert(
            format!("S{i}"),
            json!({ "type": "object", "properties": {
                "left": { "$ref": next }, "right": { "$ref": next } } }),
        );
    }
    schemas.insert("S40".into(), json!({ "type": "string" }));
    let doc = document(
        json!({
            "/huge": { "post": { "requestBody": { "content": { "application/json": {
                "schema": { "$ref": "#/components/schemas/S0" } } } } } },
            "/fine": { "get": { "operationId": "fine" } },
        }),
        Value::Object(schemas),
    );
    let api = parse(&doc);
    assert_eq!(api.operations.len(), 1);
    assert_eq!(api.operations[0].tool.name, "fine");
    assert!(
        api.skipped[0].reason.contains("more than")
            && (api.skipped[0].reason.contains("nodes") || api.skipped[0].reason.contains("deep")),
        "{:?}",
        api.skipped
    );
}

/// A cycle through a thousand schemas, and a chain as long without one:
/// both end at the depth limit instead of the stack's.
#[test]
fn a_deep_ref_chain_or_cycle_stays_bounded() {
    for cyclic in [true, false] {
        let mut schemas = serde_json::Map::new();
        for i in 0..1000 {
            let next = if cyclic { (i + 1) % 1000 } else { i + 1 };
            schemas.insert(
                format!("S{i}"),
                json!({ "type": "array", "items": { "$ref": format!("#/components/schemas/S{next}") } }),
            );
        }
        schemas.insert("S1000".into(), json!({ "type": "string" }));
        let doc = document(
            json!({ "/deep": { "post": { "requestBody": { "content": { "application/json": {
                "schema": { "$ref": "#/components/schemas/S0" } } } } } } }),
            Value::Object(schemas),
        );
        let api = parse(&doc);
        assert!(api.operations.is_empty(), "cyclic {cyclic}");
        assert!(
            api.skipped[0].reason.contains("levels deep"),
            "{:?}",
            api.skipped
        );
    }
}

/// An enum of a million values is a huge schema without any `$ref`.
#[test]
fn a_huge_inline_schema_is_skipped_and_the_total_is_bounded() {
    let values: Vec<Value> = (0..100_000).map(Value::from).collect();
    let doc = document(
        json!({ "/big": { "get": { "parameters": [{ "name": "v", "in": "query",
            "schema": { "type": "integer", "enum": values } }] } } }),
        json!({}),
    );
    let api = parse(&doc);
    assert!(api.operations.is_empty());
    assert!(
        api.skipped[0].reason.contains("20000 nodes"),
        "{:?}",
        api.skipped
    );
    // Each operation's schema fits, but together they pass the total.
    let paths: serde_json::Map<String, Value> = (0..50)
        .map(|i| {
            let values: Vec<Value> = (0..1000).map(Value::from).collect();
            (
                format!("/p{i}"),
                json!({ "get": { "parameters": [{ "name": "v", "in": "query",
                    "schema": { "enum": values } }] } }),
            )
        })
        .collect();
    let limits = Limits {
        max_total_schema_nodes: 10_000,
        ..Limits::default()
    };
    let api = parse_with(&document(Value::Object(paths), json!({})), &limits).unwrap();
    assert!(api.operations.len() < 10, "{}", api.operations.len());
    assert!(api.skipped[0].reason.contains("max_total_schema_nodes"));
}

#[test]
fn include_and_exclude_choose_operations_by_id_or_method_and_path() {
    let doc = document(
        json!({
            "/pets": { "get": { "operationId": "listPets" }, "post": { "operationId": "createPet" } },
            "/pets/{id}": { "get": {}, "delete": { "operationId": "deletePet" } },
            "/admin/users": { "get": { "operationId": "listUsers" } },
        }),
        json!({}),
    );
    let chosen = |include: &[&str], exclude: &[&str]| -> Vec<String> {
        let selection = manifold_openapi::Selection {
            include: include.iter().map(|s| s.to_string()).collect(),
            exclude: exclude.iter().map(|s| s.to_string()).collect(),
        };
        let bytes = doc.to_string();
        Api::parse_selected(bytes.as_bytes(), "t.json", &Limits::default(), &selection)
            .unwrap()
            .operations
            .into_iter()
            .map(|o| o.tool.name)
            .collect()
    };
    assert_eq!(
        chosen(&[], &[]),
        [
            "listPets",
            "createPet",
            "get_pets_id",
            "deletePet",
            "listUsers"
        ]
    );
    assert_eq!(chosen(&["GET /pets*"], &[]), ["listPets", "get_pets_id"]);
    assert_eq!(chosen(&["*Pet?"], &["DELETE *"]), ["listPets"]);
    assert_eq!(
        chosen(&[], &["* /admin/*", "create*"]),
        ["listPets", "get_pets_id", "deletePet"]
    );
    // The operation limit counts what is chosen.
    let limits = Limits {
        max_operations: 2,
        ..Limits::default()
    };
    let selection = manifold_openapi::Selection {
        include: vec!["GET *".into()],
        exclude: vec!["listUsers".into()],
    };
    let bytes = doc.to_string();
    assert!(Api::parse_selected(bytes.as_bytes(), "t.json", &limits, &selection).is_ok());
    assert!(Api::parse(bytes.as_bytes(), "t.json", &limits).is_err());
}

/// Ten thousand paths that share one path item through `$ref` still count
/// as ten thousand operations.
#[test]
fn path_items_shared_by_ref_count_once_per_path() {
    let paths: serde_json::Map<String, Value> = (0..10_000)
        .map(|i| {
            (
                format!("/op{i}"),
                json!({ "$ref": "#/components/pathItems/Shared" }),
            )
        })
        .collect();
    let mut doc = document(Value::Object(paths), json!({}));
    doc["components"]["pathItems"] = json!({ "Shared": { "get": {}, "post": {} } });
    let error = parse_with(&doc, &Limits::default())
        .unwrap_err()
        .to_string();
    assert!(error.contains("20000 operations"), "{error}");
}
