//! "Did you mean": the known tools closest to a name that was not found.

use crate::ToolDoc;

/// The longest name the suggester looks at: its work grows with the name's
/// length times the catalog's, and no real tool name comes near it.
pub const MAX_SUGGESTED_NAME_BYTES: usize = 256;

/// Up to `n` ids of `docs` close to `name`, best first; none for a name
/// longer than [`MAX_SUGGESTED_NAME_BYTES`].
///
/// A tool is a candidate when its id or its bare name is within a typo budget
/// of `name` (edit distance at most a third of the name's length, and at least
/// 2), or when one contains the other (for names of three characters or more).
/// Close spellings rank first by distance, then containment matches; ties go
/// to the smaller id.
pub(crate) fn suggest(docs: &[ToolDoc], name: &str, n: usize) -> Vec<String> {
    if name.len() > MAX_SUGGESTED_NAME_BYTES {
        return Vec::new();
    }
    let query: Vec<char> = name.trim().to_lowercase().chars().collect();
    if query.is_empty() || n == 0 {
        return Vec::new();
    }
    let budget = (query.len() / 3).max(2);
    let query_str: String = query.iter().collect();

    let mut found: Vec<(usize, &str)> = Vec::new();
    for doc in docs {
        let mut best = usize::MAX;
        for cand in [&doc.id, &doc.name] {
            let cand = cand.to_lowercase();
            let chars: Vec<char> = cand.chars().collect();
            if chars.len().abs_diff(query.len()) <= budget {
                let d = levenshtein(&query, &chars);
                if d <= budget {
                    best = best.min(d);
                    continue;
                }
            }
            let contains = (query.len() >= 3 && cand.contains(&query_str))
                || (chars.len() >= 3 && query_str.contains(&cand));
            if contains {
                // After every close spelling; shorter leftovers first.
                best = best.min(budget + 1 + chars.len().abs_diff(query.len()));
            }
        }
        if best != usize::MAX {
            found.push((best, &doc.id));
        }
    }
    found.sort_unstable();
    found
        .into_iter()
        .take(n)
        .map(|(_, id)| id.to_string())
        .collect()
}

/// Edit distance (insertions, deletions, substitutions), two-row version.
fn levenshtein(a: &[char], b: &[char]) -> usize {
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::{MAX_SUGGESTED_NAME_BYTES, levenshtein, suggest};
    use crate::ToolDoc;

    #[test]
    fn a_name_past_the_limit_gets_no_suggestions() {
        let doc = ToolDoc {
            id: "files__read".into(),
            name: "read".into(),
            ..ToolDoc::default()
        };
        let docs = [doc];
        let long = format!("files__read{}", " ".repeat(MAX_SUGGESTED_NAME_BYTES));
        assert!(suggest(&docs, &long, 5).is_empty());
        assert_eq!(suggest(&docs, "files__raed", 5), ["files__read"]);
    }

    fn lev(a: &str, b: &str) -> usize {
        let a: Vec<char> = a.chars().collect();
        let b: Vec<char> = b.chars().collect();
        levenshtein(&a, &b)
    }

    #[test]
    fn edit_distance() {
        assert_eq!(lev("", ""), 0);
        assert_eq!(lev("abc", ""), 3);
        assert_eq!(lev("kitten", "sitting"), 3);
        assert_eq!(lev("serach", "search"), 2);
        assert_eq!(lev("read_file", "read_file"), 0);
    }
}
