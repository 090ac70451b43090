//! Config parsing: any text is a config or a clear error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = manifold::config::Config::parse(text, std::path::PathBuf::from("/nonexistent"));
    }
});
