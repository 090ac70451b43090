//! Tool names from operations: safe characters, no `__` (it separates server
//! and tool), unique within the document, and within the length left once
//! the server's name is in front.

use std::collections::HashSet;

/// Names already given, and the longest one allowed.
pub(crate) struct Names {
    taken: HashSet<String>,
    max_len: usize,
}

impl Names {
    pub(crate) fn new(max_len: usize) -> Self {
        Self {
            taken: HashSet::new(),
            max_len,
        }
    }

    /// A name for the operation `METHOD /path` whose id is `operation_id`.
    pub(crate) fn name(&mut self, operation_id: Option<&str>, method: &str, path: &str) -> String {
        let label = format!("{} {path}", method.to_ascii_uppercase());
        let wanted = match operation_id.map(safe).filter(|id| !id.is_empty()) {
            Some(id) => id,
            None => {
                let from_path = safe(&format!("{method}_{path}"));
                if from_path.is_empty() {
                    "operation".to_string()
                } else {
                    from_path
                }
            }
        };
        let base = fit(&wanted, self.max_len, &label);
        let mut name = base.clone();
        let mut n = 2;
        while self.taken.contains(&name.to_ascii_lowercase()) {
            let suffix = format!("_{n}");
            name = format!(
                "{}{suffix}",
                fit(&base, self.max_len - suffix.len(), &label)
            );
            n += 1;
        }
        self.taken.insert(name.to_ascii_lowercase());
        name
    }
}

/// Letters, digits, `_` and `-`; anything else becomes `_`, and runs of `_`
/// become one.
fn safe(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '-' {
            c
        } else {
            '_'
        };
        if c == '_' && out.ends_with('_') {
            continue;
        }
        out.push(c);
    }
    out.trim_matches('_').to_string()
}

/// `name`, or when longer than `max_len` its start and a hash of `label`
/// that keeps cut names apart.
fn fit(name: &str, max_len: usize, label: &str) -> String {
    if name.len() <= max_len {
        return name.to_string();
    }
    let hash = format!("{:08x}", fnv1a(label.as_bytes()));
    let keep = max_len.saturating_sub(hash.len() + 1);
    // `safe` names are ASCII, so any byte index is a char boundary.
    let start = name[..keep.min(name.len())].trim_end_matches('_');
    if start.is_empty() {
        return hash[..max_len.min(hash.len())].to_string();
    }
    format!("{start}_{hash}")
}

fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash: u32, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_safe_unique_and_short_enough() {
        let mut names = Names::new(20);
        assert_eq!(names.name(Some("listPets"), "get", "/pets"), "listPets");
        assert_eq!(names.name(None, "get", "/pets/{petId}"), "get_pets_petId");
        assert_eq!(
            names.name(Some("list.pets v2"), "get", "/x"),
            "list_pets_v2"
        );
        assert_eq!(names.name(Some("a__b"), "get", "/y"), "a_b");
        assert_eq!(names.name(Some("listPets"), "get", "/other"), "listPets_2");
        assert_eq!(names.name(Some("LISTPETS"), "get", "/third"), "LISTPETS_3");
        let long = names.name(None, "get", "/a/very/long/path/{with}/many/segments");
        assert!(long.len() <= 20, "{long}");
        let other = names.name(None, "get", "/a/very/long/path/{with}/many/segments/too");
        assert!(other.len() <= 20 && other != long, "{other} {long}");
        assert_eq!(names.name(Some("---"), "get", "/z"), "---");
        assert_eq!(names.name(Some("%%%"), "post", "/"), "post");
    }
}
