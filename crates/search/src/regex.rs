//! The regex strategy: a pattern matched against names and descriptions.
//!
//! Patterns come from models and users, so they are bounded before use: at most
//! [`MAX_PATTERN_LEN`] characters, and a compiled program of at most
//! [`MAX_COMPILED_SIZE`] bytes. The `regex` crate matches in linear time, so a
//! pattern that compiles within those bounds cannot blow up at match time.

use regex::{Regex, RegexBuilder};

use crate::{SearchError, ToolDoc};

/// Longest pattern accepted, in characters.
pub const MAX_PATTERN_LEN: usize = 256;

/// Largest compiled program accepted, in bytes.
pub const MAX_COMPILED_SIZE: usize = 1 << 20;

/// Compiles a search pattern, case-insensitive unless it says `(?-i)`.
pub(crate) fn compile(pattern: &str) -> Result<Regex, SearchError> {
    let len = pattern.chars().count();
    if len > MAX_PATTERN_LEN {
        return Err(SearchError::PatternTooLong {
            len,
            max: MAX_PATTERN_LEN,
        });
    }
    RegexBuilder::new(pattern)
        .case_insensitive(true)
        .size_limit(MAX_COMPILED_SIZE)
        .dfa_size_limit(MAX_COMPILED_SIZE)
        .nest_limit(64)
        .build()
        .map_err(|e| match e {
            regex::Error::CompiledTooBig(limit) => SearchError::PatternTooComplex { limit },
            other => SearchError::InvalidPattern(other.to_string()),
        })
}

/// How well `doc` matches: a match in the name counts most, then the title,
/// then the description, then the server (its name or description). Zero
/// means no match. `server_matches` is asked only when needed, so that callers
/// can compute it once per server rather than once per tool.
pub(crate) fn score(re: &Regex, doc: &ToolDoc, server_matches: impl FnOnce() -> bool) -> f32 {
    let mut score = 0.0;
    if re.is_match(&doc.name) || re.is_match(&doc.id) {
        score += 4.0;
    }
    if doc.title.as_deref().is_some_and(|t| re.is_match(t)) {
        score += 2.0;
    }
    if re.is_match(&doc.description) {
        score += 1.0;
    }
    if server_matches() {
        score += 0.5;
    }
    score
}

/// Whether the server's name or description matches.
pub(crate) fn server_matches(re: &Regex, doc: &ToolDoc) -> bool {
    re.is_match(&doc.server) || re.is_match(&doc.server_description)
}
