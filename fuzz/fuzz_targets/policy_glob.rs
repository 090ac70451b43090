//! The globs of token scopes and policies, against a simple reference.
#![no_main]

use libfuzzer_sys::fuzz_target;
use manifold_store::glob_match;

/// Dynamic programming over (pattern, text) prefixes: slow but obviously right.
fn reference(pattern: &[char], text: &[char]) -> bool {
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

fuzz_target!(|data: &[u8]| {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    let (pattern, text) = input.split_once('\n').unwrap_or((input, ""));
    if pattern.len() > 256 || text.len() > 1024 {
        let _ = glob_match(pattern, text);
        return;
    }
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    assert_eq!(
        glob_match(pattern, text),
        reference(&p, &t),
        "{pattern:?} vs {text:?}"
    );
});
