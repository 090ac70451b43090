//! TypeScript stripping: any text gives JavaScript or a syntax error, never a panic.
//! The body is `manifold_fuzzing::strip_types_target`, which `cargo test` also runs over this
//! target's corpus.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| manifold_fuzzing::strip_types_target(data));
