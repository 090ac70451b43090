//! Upstream pagination: any sequence of pages and cursors ends, within the
//! page cap, without a repeated cursor.
//! The body is `manifold_fuzzing::cursors`, which `cargo test` also runs over this
//! target's corpus.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| manifold_fuzzing::cursors(data));
