//! Generates stubs for every tool of the given JSONL catalogs and parses
//! them with oxc: `cargo run -p manifold-codemode --example check_catalogs --
//! ../shared/data/catalogs/*.jsonl`.

use manifold_codemode::{StubTool, declarations};
use serde_json::Value;

fn main() {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    let catalog = manifold_catalog::jsonl::read_catalogs(&paths).expect("readable catalogs");
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
    let allocator = oxc_allocator::Allocator::default();
    let parsed = oxc_parser::Parser::new(&allocator, &source, oxc_span::SourceType::d_ts()).parse();
    let errors: Vec<_> = parsed.diagnostics.errors().collect();
    println!(
        "{} tools, {} bytes of declarations, {} parse errors{}",
        tools.len(),
        source.len(),
        errors.len(),
        if parsed.panicked {
            " (parser gave up)"
        } else {
            ""
        }
    );
    for error in errors.iter().take(5) {
        println!("{error:?}");
    }
    if !errors.is_empty() || parsed.panicked {
        std::process::exit(1);
    }
}
