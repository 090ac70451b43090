//! `Authorization` and `Origin` parsing: never a panic, and no token or
//! origin that the rules below would refuse.
#![no_main]

use http::{HeaderMap, HeaderValue, header};
use libfuzzer_sys::fuzz_target;
use manifold_server::fuzzing::{bearer, origin_allowed};

fuzz_target!(|data: &[u8]| {
    let Ok(value) = HeaderValue::from_bytes(data) else {
        return;
    };
    let mut headers = HeaderMap::new();
    headers.insert(header::AUTHORIZATION, value.clone());
    if let Some(token) = bearer(&headers) {
        assert!(!token.is_empty());
        assert!(token.len() < data.len());
        let _ = manifold_server::principal_from_token(Some(token));
    }
    if let Ok(origin) = value.to_str() {
        let hosts = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
        if origin_allowed(origin, &hosts) {
            assert!(origin.starts_with("http://") || origin.starts_with("https://"));
            assert!(!origin.contains('@'));
        }
    }
});
