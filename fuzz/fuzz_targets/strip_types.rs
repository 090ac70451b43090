//! TypeScript stripping: any text gives JavaScript or a syntax error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use manifold_codemode::strip::strip_types;

fuzz_target!(|data: &[u8]| {
    if let Ok(source) = std::str::from_utf8(data) {
        let _ = strip_types(source);
    }
});
