//! The bodies of the fuzz targets, one function each. Each takes any bytes
//! and panics only on a real defect. `fuzz/fuzz_targets/*.rs` are one-line
//! wrappers for cargo-fuzz; the tests below replay every file of
//! `fuzz/corpus/<target>/` through the same function on every `cargo test`,
//! so what a campaign found stays checked without a nightly toolchain.

use http::{HeaderMap, HeaderValue, header};
use manifold_codemode::{
    strip::strip_types,
    stubs::{StubTool, declarations},
};
use manifold_upstream::{UpstreamError, list_tools_from_pages};
use rmcp::model::{ClientJsonRpcMessage, ListToolsResult, ServerJsonRpcMessage};
use serde_json::Value;

/// A target's body: any bytes in, a panic only on a real defect.
pub type Target = fn(&[u8]);

/// Every target, by the name its corpus folder and cargo-fuzz binary have.
pub const TARGETS: &[(&str, Target)] = &[
    ("jsonrpc", jsonrpc),
    ("headers", headers),
    ("cursors", cursors),
    ("schema_to_typescript", schema_to_typescript),
    ("strip_types", strip_types_target),
    ("policy_glob", policy_glob),
    ("config", config),
    ("openapi", openapi),
];

/// JSON-RPC messages in both directions, as the gateway decodes them from
/// clients and upstreams, and the era a negotiated version maps to.
pub fn jsonrpc(data: &[u8]) {
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
}

/// `Authorization` and `Origin` parsing: never a panic, and no token or
/// origin that the rules below would refuse.
pub fn headers(data: &[u8]) {
    let Ok(value) = HeaderValue::from_bytes(data) else {
        return;
    };
    let mut headers = HeaderMap::new();
    headers.insert(header::AUTHORIZATION, value.clone());
    if let Some(token) = manifold_server::fuzzing::bearer(&headers) {
        assert!(!token.is_empty());
        assert!(token.len() < data.len());
        let _ = manifold_server::principal_from_token(Some(token));
    }
    if let Ok(origin) = value.to_str() {
        let hosts = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
        if manifold_server::fuzzing::origin_allowed(origin, &hosts) {
            assert!(origin.starts_with("http://") || origin.starts_with("https://"));
            assert!(!origin.contains('@'));
        }
    }
}

/// Upstream pagination: any sequence of pages and cursors ends, within the
/// page cap, without a repeated cursor.
pub fn cursors(data: &[u8]) {
    const MAX_PAGES: usize = 20;
    // Each byte is one page: 0 ends the listing, else the next cursor is that
    // byte's value modulo a small alphabet, so repeats are common.
    let pages: Vec<ListToolsResult> = data
        .iter()
        .map(|b| ListToolsResult {
            next_cursor: (*b != 0).then(|| format!("c{}", b % 23)),
            ..Default::default()
        })
        .collect();
    match list_tools_from_pages(pages, MAX_PAGES) {
        Ok(listing) => {
            assert!(listing.pages <= MAX_PAGES);
            assert!(listing.pages <= data.len());
        }
        Err(UpstreamError::CursorLoop { page, .. }) => assert!(page <= MAX_PAGES),
        Err(UpstreamError::TooManyPages { max_pages, .. }) => assert_eq!(max_pages, MAX_PAGES),
        // The pages ran out: the fuzzer's "connection closed".
        Err(UpstreamError::Protocol { .. }) => {}
        Err(other) => panic!("unexpected {other}"),
    }
}

/// JSON Schema to TypeScript stubs: any schema gives declarations, and the
/// declarations are TypeScript that the stripper accepts.
pub fn schema_to_typescript(data: &[u8]) {
    let Ok(schema) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let (input, output) = match &schema {
        Value::Array(pair) if pair.len() == 2 => (&pair[0], Some(&pair[1])),
        other => (other, None),
    };
    let name = schema
        .get("title")
        .and_then(Value::as_str)
        .unwrap_or("tool");
    let tool = StubTool {
        server: "fuzz",
        name,
        description: "A fuzzed tool. */ /* and `quotes`",
        input_schema: input,
        output_schema: output,
    };
    let stubs = declarations(&[tool]);
    if let Err(error) = strip_types(&stubs) {
        panic!("generated stubs do not parse: {error:?}\n{stubs}");
    }
}

/// TypeScript stripping: any text gives JavaScript or a syntax error, never a
/// panic.
pub fn strip_types_target(data: &[u8]) {
    if let Ok(source) = std::str::from_utf8(data) {
        let _ = strip_types(source);
    }
}

/// The globs of token scopes and policies, against a simple reference.
pub fn policy_glob(data: &[u8]) {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    let (pattern, text) = input.split_once('\n').unwrap_or((input, ""));
    if pattern.len() > 256 || text.len() > 1024 {
        let _ = manifold_store::glob_match(pattern, text);
        return;
    }
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    assert_eq!(
        manifold_store::glob_match(pattern, text),
        glob_reference(&p, &t),
        "{pattern:?} vs {text:?}"
    );
}

/// Dynamic programming over (pattern, text) prefixes: slow but obviously right.
fn glob_reference(pattern: &[char], text: &[char]) -> bool {
    // matched[j]: whether pattern[..i] matches text[..j], row by row.
    let mut matched = vec![false; text.len() + 1];
    matched[0] = true;
    for p in pattern {
        let mut next = vec![false; text.len() + 1];
        match p {
            '*' => {
                let mut any = false;
                for j in 0..=text.len() {
                    any |= matched[j];
                    next[j] = any;
                }
            }
            _ => {
                for j in 1..=text.len() {
                    next[j] = matched[j - 1] && (*p == '?' || *p == text[j - 1]);
                }
            }
        }
        matched = next;
    }
    matched[text.len()]
}

/// Config parsing: any text is a config or a clear error, never a panic.
pub fn config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = manifold_config::Config::parse(text, std::path::PathBuf::from("/nonexistent"));
    }
}

/// OpenAPI documents into tools and calls into requests: any bytes are
/// tools or a clear error, within the limits, and no argument changes a
/// request's origin or the fixed part of its path.
pub fn openapi(data: &[u8]) {
    use manifold_openapi::{Api, Limits, Target};
    let limits = Limits {
        max_document_bytes: 1 << 20,
        max_operations: 64,
        max_schema_nodes: 2000,
        max_total_schema_nodes: 20_000,
        max_schema_depth: 32,
        max_tool_name_len: 40,
    };
    let Ok(api) = Api::parse(data, "fuzz", &limits) else {
        return;
    };
    let mut names = std::collections::HashSet::new();
    let target = Target {
        base: "https://api.example.com/base".parse().expect("a URL"),
        headers: HeaderMap::new(),
        query: Vec::new(),
    };
    for operation in &api.operations {
        let name = &operation.tool.name;
        assert!(name.len() <= limits.max_tool_name_len, "{name}");
        assert!(!name.contains("__"), "{name}");
        assert!(names.insert(name.to_ascii_lowercase()), "{name} twice");
        assert_eq!(operation.tool.input_schema["type"], "object");
        // Every argument a string made of the document's own bytes.
        let text = String::from_utf8_lossy(&data[..data.len().min(64)]).into_owned();
        let arguments: serde_json::Map<String, Value> = operation.tool.input_schema["properties"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(argument, _)| (argument.clone(), Value::String(text.clone())))
            .collect();
        if let Ok(request) = operation.prepare(&target, &arguments) {
            assert_eq!(request.url.origin(), target.base.origin());
            assert!(request.url.path().starts_with("/base"), "{}", request.url);
            for value in request.headers.values() {
                assert!(!value.as_bytes().contains(&b'\n'));
            }
        }
    }
}

#[cfg(test)]
mod corpus {
    use std::path::{Path, PathBuf};

    fn corpus_dir(target: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/corpus")
            .join(target)
    }

    /// Every committed input of every target, through the target's body.
    #[test]
    fn every_corpus_file_replays_without_a_failure() {
        let mut replayed = Vec::new();
        for (target, body) in super::TARGETS {
            let dir = corpus_dir(target);
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .map(|entry| entry.unwrap().path())
                .filter(|path| path.is_file())
                .collect();
            files.sort();
            assert!(
                !files.is_empty(),
                "{target}: no corpus in {}",
                dir.display()
            );
            for file in &files {
                let data = std::fs::read(file).unwrap();
                let outcome = std::panic::catch_unwind(|| body(&data));
                assert!(outcome.is_ok(), "{target}: {} fails", file.display());
            }
            replayed.push(format!("{target} {}", files.len()));
        }
        eprintln!("replayed: {}", replayed.join(", "));
    }

    /// Every corpus folder has a target, and every target a cargo-fuzz binary.
    #[test]
    fn the_targets_match_the_corpus_folders_and_the_fuzz_crate() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
        let mut folders: Vec<String> = std::fs::read_dir(root.join("corpus"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        folders.sort();
        let mut targets: Vec<String> = super::TARGETS.iter().map(|(t, _)| t.to_string()).collect();
        targets.sort();
        assert_eq!(folders, targets);
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        for target in &targets {
            assert!(
                manifest.contains(&format!("name = \"{target}\"")),
                "fuzz/Cargo.toml has no [[bin]] {target}"
            );
            let wrapper =
                std::fs::read_to_string(root.join(format!("fuzz_targets/{target}.rs"))).unwrap();
            assert!(
                wrapper.contains("manifold_fuzzing::"),
                "{target}.rs calls the shared body"
            );
        }
    }
}
