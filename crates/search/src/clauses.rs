//! The steps of a task-like query, for retrieving per step as well as for
//! the whole (see `HybridParams::clause_weight`).
//!
//! An agent's query is often a task of several steps ("find the cheapest
//! flight to Paris, book a hotel near the station and add both to my
//! calendar"). One vector of the whole averages the steps' needs; each step
//! alone ranks its own tools first.

/// At most this many steps take part: each costs a BM25F pass (and a row of
/// the query batch when clauses are embedded).
pub const MAX_CLAUSES: usize = 4;
/// Queries with fewer words are one step.
const MIN_QUERY_WORDS: usize = 10;
/// A step needs this many words to stand alone.
const MIN_CLAUSE_WORDS: usize = 3;

/// The query's steps, in order, when it has at least two of them; empty
/// otherwise. Steps end at a sentence end, a semicolon or a line break, and
/// at a joining "then", "and then", "after that", "finally" or ", and".
/// Short pieces join the step before them.
pub fn split(query: &str) -> Vec<&str> {
    if query.split_whitespace().count() < MIN_QUERY_WORDS {
        return Vec::new();
    }
    let lower = query.to_lowercase();
    // `to_lowercase` can change byte lengths (rare scripts): cut nothing then.
    if lower.len() != query.len() {
        return Vec::new();
    }
    let mut cuts = vec![0];
    let bytes = lower.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        let next_is_space = bytes.get(i + 1).is_none_or(|c| c.is_ascii_whitespace());
        if matches!(b, b'.' | b'!' | b'?') && next_is_space || matches!(b, b';' | b'\n') {
            cuts.push(i + 1);
        }
    }
    for joiner in [
        ", and then ",
        " and then ",
        ", then ",
        " then ",
        ", after that ",
        " after that ",
        ", finally ",
        ", and ",
    ] {
        let mut from = 0;
        while let Some(at) = lower[from..].find(joiner) {
            cuts.push(from + at);
            from += at + joiner.len();
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    cuts.push(query.len());
    let mut steps: Vec<&str> = Vec::new();
    let mut start = 0;
    for &end in &cuts[1..] {
        let piece = trim_step(&query[start..end]);
        if piece.split_whitespace().count() >= MIN_CLAUSE_WORDS {
            steps.push(piece);
            start = end;
        } else if let Some(last) = steps.last_mut() {
            // Too short alone: it belongs to the step before.
            let from = last.as_ptr() as usize - query.as_ptr() as usize;
            *last = trim_step(&query[from..end]);
            start = end;
        }
    }
    if steps.len() < 2 {
        return Vec::new();
    }
    steps.truncate(MAX_CLAUSES);
    steps
}

/// A piece without its joining words and punctuation at either end.
fn trim_step(piece: &str) -> &str {
    let mut s =
        piece.trim_matches(|c: char| c.is_whitespace() || matches!(c, ',' | '.' | ';' | '!' | '?'));
    loop {
        let lower = s.to_lowercase();
        let Some(word) = ["and then ", "then ", "after that ", "finally ", "and "]
            .iter()
            .find(|w| lower.starts_with(**w) && lower.len() == s.len())
        else {
            return s;
        };
        s = s[word.len()..].trim_start();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_splits_into_its_steps() {
        let q = "Find the cheapest flight from Berlin to Paris next Friday, then book a hotel near \
                 the Gare du Nord and add both bookings to my calendar. Finally email the plan to Anna.";
        assert_eq!(
            split(q),
            vec![
                "Find the cheapest flight from Berlin to Paris next Friday",
                "book a hotel near the Gare du Nord and add both bookings to my calendar",
                "email the plan to Anna",
            ]
        );
    }

    #[test]
    fn short_queries_and_single_steps_stay_whole() {
        assert!(split("read a file").is_empty());
        assert!(
            split("search the web for recent papers about retrieval models and their training")
                .is_empty()
        );
        // A piece too short to stand alone joins the step before it.
        let q = "Download the quarterly report from the shared drive; summarise it. Thanks a lot.";
        assert_eq!(
            split(q),
            vec![
                "Download the quarterly report from the shared drive; summarise it",
                "Thanks a lot"
            ]
        );
    }

    #[test]
    fn many_steps_are_capped_and_non_ascii_text_is_safe() {
        let q =
            "Open the door. Walk to the car. Drive to the shop. Buy some bread. Drive back home.";
        assert_eq!(split(q).len(), MAX_CLAUSES);
        assert!(
            split("Öffne die Tür. Geh zum Auto. Fahr zum Laden und kauf Brot ein. İstanbul").len()
                <= MAX_CLAUSES
        );
        assert!(split("数据库 查询 SQL 然后 写入 文件 再 发送 邮件 给 同事 和 老板").is_empty());
    }
}
