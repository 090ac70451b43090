//! Provider-facing names.
//!
//! Both APIs take names matching `^[a-zA-Z0-9_-]{1,64}$` (functions,
//! namespaces and Anthropic tools alike). A name that already fits is used as
//! is; any other is sanitized, cut, and given a hash suffix of the original,
//! so two tools never share a provider name and the mapping can be reversed
//! by recomputing it over the caller's catalog.

use sha2::{Digest, Sha256};

/// Longest name either API accepts.
pub const MAX_LEN: usize = 64;

fn valid_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// Whether `name` is accepted as it is.
pub fn is_valid(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_LEN && name.chars().all(valid_char)
}

/// `name` made acceptable: unchanged when it already is.
pub fn provider_name(name: &str) -> String {
    if is_valid(name) {
        return name.to_string();
    }
    let digest = Sha256::digest(name.as_bytes());
    let suffix = &hex::encode(digest)[..8];
    let keep = MAX_LEN - suffix.len() - 1;
    let head: String = name
        .chars()
        .map(|c| if valid_char(c) { c } else { '_' })
        .take(keep)
        .collect();
    format!("{head}_{suffix}")
}

/// The Anthropic tool name of a qualified name.
pub fn anthropic_name(qualified: &str) -> String {
    provider_name(qualified)
}

/// The OpenAI namespace of a server.
pub fn openai_namespace(server: &str) -> String {
    provider_name(server)
}

/// The OpenAI function name of an upstream tool, inside its server's namespace.
pub fn openai_function(tool: &str) -> String {
    provider_name(tool)
}

/// One tool as name resolution sees it.
#[derive(Debug, Clone, Copy)]
pub struct NamedTool<'a> {
    pub qualified: &'a str,
    pub server: &'a str,
    pub tool: &'a str,
}

/// The qualified name a provider-facing name stands for, among `tools`.
///
/// Accepted, in this order: a qualified name; an Anthropic tool name; an
/// OpenAI function name with its `namespace`, or joined as
/// `namespace.function` (a dot never appears in a provider name).
pub fn resolve<'a>(
    tools: impl IntoIterator<Item = NamedTool<'a>> + Clone,
    name: &str,
    namespace: Option<&str>,
) -> Option<&'a str> {
    let (namespace, name) = match namespace {
        Some(ns) => (Some(ns), name),
        None => match name.split_once('.') {
            Some((ns, function)) if is_valid(ns) && is_valid(function) => (Some(ns), function),
            _ => (None, name),
        },
    };
    if let Some(ns) = namespace {
        return tools
            .into_iter()
            .find(|t| openai_namespace(t.server) == ns && openai_function(t.tool) == name)
            .map(|t| t.qualified);
    }
    if let Some(t) = tools.clone().into_iter().find(|t| t.qualified == name) {
        return Some(t.qualified);
    }
    tools
        .into_iter()
        .find(|t| anthropic_name(t.qualified) == name)
        .map(|t| t.qualified)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names_pass_through() {
        assert_eq!(
            provider_name("github__create_issue"),
            "github__create_issue"
        );
    }

    #[test]
    fn odd_names_are_sanitized_uniquely() {
        let a = provider_name("files.read");
        let b = provider_name("files/read");
        assert_ne!(a, b);
        assert!(is_valid(&a) && is_valid(&b));
        let long = provider_name(&"x".repeat(100));
        assert_eq!(long.len(), MAX_LEN);
        assert!(is_valid(&long));
    }

    #[test]
    fn resolves_every_form() {
        let tools = [
            NamedTool {
                qualified: "gh__create_issue",
                server: "gh",
                tool: "create_issue",
            },
            NamedTool {
                qualified: "fs__read_1234abcd",
                server: "fs",
                tool: "read.file",
            },
        ];
        let it = tools.iter().copied();
        assert_eq!(
            resolve(it.clone(), "gh__create_issue", None),
            Some("gh__create_issue")
        );
        assert_eq!(
            resolve(it.clone(), "create_issue", Some("gh")),
            Some("gh__create_issue")
        );
        assert_eq!(
            resolve(it.clone(), "gh.create_issue", None),
            Some("gh__create_issue")
        );
        let function = openai_function("read.file");
        assert_eq!(
            resolve(it.clone(), &function, Some("fs")),
            Some("fs__read_1234abcd")
        );
        assert_eq!(resolve(it, "nope", None), None);
    }
}
