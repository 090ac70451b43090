//! JSON Schema to TypeScript stubs: any schema gives declarations, and the
//! declarations are TypeScript that the stripper accepts.
//! The body is `manifold_fuzzing::schema_to_typescript`, which `cargo test` also runs over this
//! target's corpus.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| manifold_fuzzing::schema_to_typescript(data));
