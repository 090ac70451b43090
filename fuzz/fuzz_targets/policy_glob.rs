//! The globs of token scopes and policies, against a simple reference.
//! The body is `manifold_fuzzing::policy_glob`, which `cargo test` also runs over this
//! target's corpus.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| manifold_fuzzing::policy_glob(data));
