//! JSON-RPC messages in both directions, as the gateway decodes them from
//! clients and upstreams, and the era a negotiated version maps to.
//! The body is `manifold_fuzzing::jsonrpc`, which `cargo test` also runs over this
//! target's corpus.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| manifold_fuzzing::jsonrpc(data));
