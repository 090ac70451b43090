//! Every declaration generated for the shipped demo catalog (689 tools from
//! real registries: LiveMCPBench and the Docker MCP catalog) parses as
//! TypeScript, checked with oxc's parser.

use manifold_codemode::{StubTool, declarations};
use oxc_allocator::Allocator;
use oxc_parser::Parser;
use oxc_span::SourceType;
use serde_json::Value;

fn parse_errors(source: &str) -> Vec<String> {
    let allocator = Allocator::default();
    let parsed = Parser::new(&allocator, source, SourceType::d_ts()).parse();
    let mut errors: Vec<String> = parsed
        .diagnostics
        .errors()
        .map(|e| format!("{e:?}"))
        .collect();
    if parsed.panicked {
        errors.push("the parser gave up".into());
    }
    errors
}

#[test]
fn demo_catalog_declarations_parse() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/demo/tools.jsonl"
    );
    let catalog = manifold_catalog::jsonl::read_catalogs(&[path]).unwrap();
    let schemas: Vec<(String, String, String, Value)> = catalog
        .listings
        .iter()
        .flat_map(|(server, _, tools)| {
            tools.iter().map(move |t| {
                (
                    server.clone(),
                    t.name.to_string(),
                    t.description.as_deref().unwrap_or("").to_string(),
                    Value::Object((*t.input_schema).clone()),
                )
            })
        })
        .collect();
    assert!(schemas.len() > 600, "{}", schemas.len());
    let tools: Vec<StubTool<'_>> = schemas
        .iter()
        .map(|(server, name, description, schema)| StubTool {
            server,
            name,
            description,
            input_schema: schema,
            output_schema: None,
        })
        .collect();
    let source = declarations(&tools);
    let errors = parse_errors(&source);
    assert!(
        errors.is_empty(),
        "{} parse errors, first: {}",
        errors.len(),
        errors[0]
    );
    assert_eq!(source.matches("\n  function ").count(), tools.len());
}

#[test]
fn a_broken_declaration_is_caught() {
    // The check above can fail: oxc rejects malformed declarations.
    assert!(!parse_errors("declare namespace x { function (input: ): Promise<; }").is_empty());
}
