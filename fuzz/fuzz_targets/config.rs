//! Config parsing: any text is a config or a clear error, never a panic.
//! The body is `manifold_fuzzing::config`, which `cargo test` also runs over this
//! target's corpus.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| manifold_fuzzing::config(data));
