//! JSON-RPC messages in both directions, as the gateway decodes them from
//! clients and upstreams, and the era a negotiated version maps to.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};

fuzz_target!(|data: &[u8]| {
    if let Ok(message) = serde_json::from_slice::<ClientJsonRpcMessage>(data) {
        // What decodes must encode again.
        serde_json::to_vec(&message).expect("a decoded client message re-encodes");
    }
    if let Ok(message) = serde_json::from_slice::<ServerJsonRpcMessage>(data) {
        serde_json::to_vec(&message).expect("a decoded server message re-encodes");
    }
    if let Ok(version) = std::str::from_utf8(data) {
        let era = manifold_upstream::era_of(version);
        if version.len() != 10 {
            assert_eq!(era, manifold_upstream::Era::Legacy);
        }
    }
});
