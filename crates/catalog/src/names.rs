use sha2::{Digest, Sha256};

/// Longest qualified name; the strictest model APIs allow 64 characters.
pub const MAX_NAME_LEN: usize = 64;
const SEPARATOR: &str = "__";

fn valid_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// The qualified name `server__tool`. It depends only on the pair, so it is stable
/// as other tools come and go. A name that is too long or has characters outside
/// `[A-Za-z0-9_-]` is sanitized, cut, and given a hash suffix so that two different
/// tools never collide.
pub fn qualify(server: &str, tool: &str) -> String {
    let plain = format!("{server}{SEPARATOR}{tool}");
    if plain.len() <= MAX_NAME_LEN && tool.chars().all(valid_char) && !tool.is_empty() {
        return plain;
    }
    let digest = Sha256::digest(format!("{server}\0{tool}").as_bytes());
    let suffix = &hex::encode(digest)[..8];
    let sanitized: String = plain
        .chars()
        .map(|c| if valid_char(c) { c } else { '_' })
        .collect();
    let keep = MAX_NAME_LEN - suffix.len() - 1;
    let head: String = sanitized.chars().take(keep).collect();
    format!("{head}_{suffix}")
}

/// `name` in the alphabet of server names: every character but ASCII
/// letters, digits and `-` becomes `_`, runs of `_` collapse to one, and `_`
/// is trimmed from both ends, so the result never holds the `__` that
/// separates server and tool. `server` when nothing is left.
pub fn server_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '-' {
            c
        } else {
            '_'
        };
        if !(c == '_' && out.ends_with('_')) {
            out.push(c);
        }
    }
    match out.trim_matches('_') {
        "" => "server".to_string(),
        trimmed => trimmed.to_string(),
    }
}

/// Split `server__tool` at the first separator. Server names never contain `__`.
pub fn split_qualified(qualified: &str) -> Option<(&str, &str)> {
    qualified.split_once(SEPARATOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_stay_readable() {
        assert_eq!(
            qualify("time", "get_current_time"),
            "time__get_current_time"
        );
        assert_eq!(
            split_qualified("time__get_current_time"),
            Some(("time", "get_current_time"))
        );
    }

    #[test]
    fn server_names_keep_to_their_alphabet() {
        assert_eq!(server_name("time"), "time");
        assert_eq!(server_name("Tickets API"), "Tickets_API");
        assert_eq!(server_name("weird name!"), "weird_name");
        assert_eq!(server_name("a & b"), "a_b");
        assert_eq!(server_name("46elks-sms"), "46elks-sms");
        assert_eq!(server_name("__x__"), "x");
        assert_eq!(server_name("!!!"), "server");
    }

    #[test]
    fn long_or_odd_names_are_shortened_without_collision() {
        let long_a = "a".repeat(100) + "x";
        let long_b = "a".repeat(100) + "y";
        let qa = qualify("srv", &long_a);
        let qb = qualify("srv", &long_b);
        assert_eq!(qa.len(), MAX_NAME_LEN);
        assert_ne!(qa, qb);
        assert!(qa.starts_with("srv__"));
        let odd1 = qualify("srv", "do.thing");
        let odd2 = qualify("srv", "do/thing");
        assert_ne!(odd1, odd2);
        assert!(odd1.chars().all(valid_char));
        // Deterministic.
        assert_eq!(qualify("srv", &long_a), qa);
    }
}
