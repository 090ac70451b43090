//! JSON Schema to TypeScript stubs: any schema gives declarations, and the
//! declarations are TypeScript that the stripper accepts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use manifold_codemode::{strip::strip_types, stubs::{StubTool, declarations}};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(schema) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let (input, output) = match &schema {
        Value::Array(pair) if pair.len() == 2 => (&pair[0], Some(&pair[1])),
        other => (other, None),
    };
    let name = schema
        .get("title")
        .and_then(Value::as_str)
        .unwrap_or("tool");
    let tool = StubTool {
        server: "fuzz",
        name,
        description: "A fuzzed tool. */ /* and `quotes`",
        input_schema: input,
        output_schema: output,
    };
    let stubs = declarations(&[tool]);
    if let Err(error) = strip_types(&stubs) {
        panic!("generated stubs do not parse: {error:?}\n{stubs}");
    }
});
