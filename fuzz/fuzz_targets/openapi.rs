//! OpenAPI documents into tools, and calls into requests: bounded, and never
//! a panic. The body is `manifold_fuzzing::openapi`, which `cargo test` also
//! runs over this target's corpus.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| manifold_fuzzing::openapi(data));
