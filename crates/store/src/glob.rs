//! The globs that token scopes and policies use: `*` matches any run of
//! characters (also none), `?` exactly one, everything else itself.

/// Whether `text` matches `pattern` as a whole.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    // Names are nearly always ASCII, and a listing matches every tool against
    // every rule: no allocation on that path.
    if pattern.is_ascii() && text.is_ascii() {
        return matches(pattern.as_bytes(), text.as_bytes(), b'*', b'?');
    }
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    matches(&pattern, &text, '*', '?')
}

fn matches<T: Copy + PartialEq>(pattern: &[T], text: &[T], any_run: T, any_one: T) -> bool {
    let (mut p, mut t) = (0, 0);
    // Where the last `*` was, and the text position it currently swallows to.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(&c) if c == any_run => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == any_one || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                // Let the last `*` swallow one more character and retry.
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == any_run)
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn matches() {
        assert!(glob_match("*", ""));
        assert!(glob_match("*", "github__create_issue"));
        assert!(glob_match("github__*", "github__create_issue"));
        assert!(!glob_match("github__*", "gitlab__create_issue"));
        assert!(glob_match("*__delete_*", "files__delete_file"));
        assert!(!glob_match("*__delete_*", "files__remove_file"));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "ac"));
        assert!(glob_match("exact", "exact"));
        assert!(!glob_match("exact", "exactly"));
        assert!(glob_match("a*b*c", "a-b-b-c"));
        assert!(!glob_match("a*b*c", "a-b-b-d"));
        assert!(glob_match("**", "x"));
        assert!(glob_match("é*", "éte"));
    }
}
