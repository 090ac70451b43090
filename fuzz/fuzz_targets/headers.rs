//! `Authorization` and `Origin` parsing: never a panic, and no token or
//! origin that the rules below would refuse.
//! The body is `manifold_fuzzing::headers`, which `cargo test` also runs over this
//! target's corpus.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| manifold_fuzzing::headers(data));
