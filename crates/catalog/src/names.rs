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
