//! The public Petstore document becomes the checked-in list of tools.

use std::path::PathBuf;

use manifold_openapi::{Api, Limits, Tier, read_document_file};
use serde_json::{Value, json};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/openapi")
        .join(name)
}

fn tools(api: &Api) -> Value {
    let tools: Vec<Value> = api
        .operations
        .iter()
        .map(|op| {
            let tier = match op.tool.tier {
                Tier::ReadOnly => "read_only",
                Tier::Write => "write",
                Tier::Destructive => "destructive",
            };
            json!({
                "name": op.tool.name,
                "title": op.tool.title,
                "description": op.tool.description,
                "tier": tier,
                "request": format!("{} {}", op.method, op.path),
                "inputSchema": op.tool.input_schema,
                "outputSchema": op.tool.output_schema,
            })
        })
        .collect();
    Value::Array(tools)
}

#[test]
fn petstore_becomes_the_expected_tools() {
    let path = fixture("petstore.yaml");
    let bytes = read_document_file(&path, &Limits::default()).unwrap();
    let api = Api::parse(&bytes, "petstore.yaml", &Limits::default()).unwrap();
    assert_eq!(api.title, "Swagger Petstore");
    assert_eq!(api.servers, ["http://petstore.swagger.io/v1"]);
    assert!(api.skipped.is_empty(), "{:?}", api.skipped);
    let produced = tools(&api);
    let expected_path = fixture("petstore.tools.json");
    if std::env::var_os("MANIFOLD_BLESS").is_some() {
        let text = serde_json::to_string_pretty(&produced).unwrap() + "\n";
        std::fs::write(&expected_path, text).unwrap();
    }
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(&expected_path).unwrap()).unwrap();
    assert_eq!(
        produced,
        expected,
        "produced:\n{}",
        serde_json::to_string_pretty(&produced).unwrap()
    );
}

/// The same document as JSON gives the same tools.
#[test]
fn petstore_as_json_gives_the_same_tools() {
    let bytes = std::fs::read(fixture("petstore.yaml")).unwrap();
    let value: Value = serde_norway::from_slice(&bytes).unwrap();
    let from_json = Api::parse(value.to_string().as_bytes(), "p.json", &Limits::default()).unwrap();
    let from_yaml = Api::parse(&bytes, "p.yaml", &Limits::default()).unwrap();
    assert_eq!(tools(&from_json), tools(&from_yaml));
}
