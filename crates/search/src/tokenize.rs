//! Text analysis shared by indexing and querying.
//!
//! The pipeline is: split on anything that is not a letter or digit, split each
//! remaining run on identifier boundaries (snake_case, camelCase, kebab-case,
//! dots, letter/digit changes), lowercase, drop English stopwords, then apply a
//! light suffix stemmer. Han and kana text has no spaces, so it is indexed as
//! overlapping character bigrams.
//!
//! Indexing and querying must go through the same [`analyze`] so that terms
//! line up; that is the one invariant of this module.

use std::sync::LazyLock;

/// Splits an identifier into its lowercase parts.
///
/// Boundaries are any non-alphanumeric character (`_`, `-`, `.`, `/`, spaces,
/// ...), a lowercase-to-uppercase change (`getTime`), the end of an acronym
/// (`HTTPServer` → `http`, `server`), and letter/digit changes (`v2` → `v`, `2`).
/// A trailing plural `s` stays on its acronym (`listIDs` → `list`, `ids`).
///
/// ```
/// use manifold_search::split_identifier;
/// assert_eq!(split_identifier("getCurrentTime"), ["get", "current", "time"]);
/// assert_eq!(split_identifier("HTTPServer2"), ["http", "server", "2"]);
/// ```
pub fn split_identifier(s: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut chars = Vec::new();
    let mut segs = Vec::new();
    for run in alnum_runs(s) {
        segments(run, &mut chars, &mut segs);
        parts.extend(segs.iter().map(|&(a, b)| run[a..b].to_lowercase()));
    }
    parts
}

/// Turns free text or an identifier into index terms (see the module docs).
pub fn analyze(text: &str, out: &mut Vec<String>) {
    Analyzer::default().run(text, |t| out.push(t.to_string()));
}

/// Reusable buffers for [`analyze`], to index many texts without allocating
/// per token.
#[derive(Default)]
pub(crate) struct Analyzer {
    chars: Vec<(usize, char)>,
    segs: Vec<(usize, usize)>,
    buf: String,
}

impl Analyzer {
    /// Calls `emit` with each term of `text`, in order.
    ///
    /// Besides the parts of a run, a run that splits into several parts also
    /// yields its joined form (`DeepWiki` → `deep`, `wiki`, `deepwiki`), so a
    /// query that writes a compound as one word still meets a document that
    /// camel-cases it. Parts made only of digits are dropped: numbers in task
    /// descriptions (dates, sizes, ids) are noise for tool retrieval, while the
    /// joined form keeps names like `base64` or `36kr` searchable.
    pub(crate) fn run(&mut self, text: &str, mut emit: impl FnMut(&str)) {
        for run in alnum_runs(text) {
            segments(run, &mut self.chars, &mut self.segs);
            let mut has_cjk = false;
            for &(a, b) in &self.segs {
                let seg = &run[a..b];
                let first = seg.chars().next().map_or(Class::Digit, class);
                if first == Class::Cjk {
                    has_cjk = true;
                    bigrams(seg, &mut emit);
                } else if first != Class::Digit {
                    term(&mut self.buf, seg, &mut emit);
                }
            }
            if self.segs.len() > 1 && !has_cjk {
                term(&mut self.buf, run, &mut emit);
            }
        }
    }
}

/// Emits overlapping two-character slices of `seg` (or `seg` itself when it
/// is a single character).
fn bigrams(seg: &str, emit: &mut impl FnMut(&str)) {
    let bounds: Vec<usize> = seg
        .char_indices()
        .map(|(i, _)| i)
        .chain([seg.len()])
        .collect();
    if bounds.len() == 2 {
        emit(seg);
    }
    for w in bounds.windows(3) {
        emit(&seg[w[0]..w[2]]);
    }
}

/// Lowercases `word` into `buf`, drops it if a stopword, else stems and emits.
fn term(buf: &mut String, word: &str, emit: &mut impl FnMut(&str)) {
    buf.clear();
    if word.is_ascii() {
        buf.push_str(word);
        buf.make_ascii_lowercase();
    } else {
        buf.extend(word.chars().flat_map(char::to_lowercase));
    }
    if !is_stopword(buf) {
        stem_in_place(buf);
        emit(buf);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Upper,
    Lower,
    Digit,
    Cjk,
}

fn class(c: char) -> Class {
    if c.is_ascii() {
        match c {
            '0'..='9' => Class::Digit,
            'A'..='Z' => Class::Upper,
            _ => Class::Lower,
        }
    } else if is_cjk(c) {
        Class::Cjk
    } else if c.is_numeric() {
        Class::Digit
    } else if c.is_uppercase() {
        Class::Upper
    } else {
        // Lowercase and uncased letters (Thai, Arabic, ...).
        Class::Lower
    }
}

/// Han ideographs and Japanese kana: scripts written without spaces.
fn is_cjk(c: char) -> bool {
    matches!(c,
        '\u{3040}'..='\u{30FF}'   // hiragana, katakana
        | '\u{3400}'..='\u{4DBF}' // CJK extension A
        | '\u{4E00}'..='\u{9FFF}' // CJK unified ideographs
        | '\u{F900}'..='\u{FAFF}' // compatibility ideographs
        | '\u{20000}'..='\u{2A6DF}')
}

/// Maximal runs of letters and digits.
fn alnum_runs(s: &str) -> impl Iterator<Item = &str> {
    // A hand-rolled `split(!is_alphanumeric)` that skips UTF-8 decoding for
    // ASCII, which is nearly all of the text indexed.
    let mut pos = 0;
    std::iter::from_fn(move || {
        let at = |i: usize| -> (bool, usize) {
            let b = s.as_bytes()[i];
            if b.is_ascii() {
                (b.is_ascii_alphanumeric(), 1)
            } else {
                let c = s[i..].chars().next().unwrap_or_default();
                (c.is_alphanumeric(), c.len_utf8())
            }
        };
        while pos < s.len() {
            let (alnum, len) = at(pos);
            if alnum {
                break;
            }
            pos += len;
        }
        let start = pos;
        while pos < s.len() {
            let (alnum, len) = at(pos);
            if !alnum {
                break;
            }
            pos += len;
        }
        (pos > start).then(|| &s[start..pos])
    })
}

/// Splits one alphanumeric run on case, digit and script boundaries, writing
/// byte ranges of `run` into `segs` (`chars` is scratch space).
fn segments(run: &str, chars: &mut Vec<(usize, char)>, segs: &mut Vec<(usize, usize)>) {
    segs.clear();
    // Most runs of prose are one lowercase word.
    if run.bytes().all(|b| b.is_ascii_lowercase()) {
        segs.push((0, run.len()));
        return;
    }
    chars.clear();
    chars.extend(run.char_indices());
    let mut start = 0;
    for i in 1..chars.len() {
        let (prev, cur) = (class(chars[i - 1].1), class(chars[i].1));
        let letter = |c: Class| matches!(c, Class::Upper | Class::Lower);
        let boundary = if letter(prev) && letter(cur) {
            match (prev, cur) {
                (Class::Lower, Class::Upper) => true,
                // End of an acronym: the last capital starts the next word
                // ("HTTPServer"), unless what follows is only a plural "s".
                (Class::Upper, Class::Upper) => {
                    let next = chars.get(i + 1).map(|&(_, c)| c);
                    let next_lower = next.is_some_and(|c| class(c) == Class::Lower);
                    let plural_s = next == Some('s') && i + 2 == chars.len();
                    next_lower && !plural_s
                }
                _ => false,
            }
        } else {
            prev != cur
        };
        if boundary {
            segs.push((start, chars[i].0));
            start = chars[i].0;
        }
    }
    if start < run.len() {
        segs.push((start, run.len()));
    }
}

/// A small English stopword list: function words, plus "please" and "etc".
/// Long task descriptions are mostly these; they say nothing about which tool
/// is needed, and words like "get" or "help" stay because tool names use them.
const STOPWORDS: &[&str] = &[
    "a", "about", "after", "again", "all", "also", "am", "an", "and", "any", "are", "as", "at",
    "be", "been", "before", "being", "both", "but", "by", "can", "could", "did", "do", "does",
    "doing", "each", "etc", "for", "from", "further", "had", "has", "have", "having", "he", "her",
    "here", "hers", "him", "his", "how", "i", "if", "in", "into", "is", "it", "its", "itself",
    "just", "let", "me", "might", "more", "most", "must", "my", "myself", "no", "nor", "not", "of",
    "off", "on", "once", "only", "or", "other", "our", "ours", "out", "over", "own", "please",
    "same", "shall", "she", "should", "so", "some", "such", "than", "that", "the", "their",
    "theirs", "them", "then", "there", "these", "they", "this", "those", "through", "to", "too",
    "under", "until", "up", "us", "very", "via", "was", "we", "were", "what", "when", "where",
    "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours",
];

/// Whether a lowercase token is a stopword.
pub fn is_stopword(token: &str) -> bool {
    // This runs for every token of every indexed text, so the (short)
    // stopwords are kept as integers in a small open-addressing table.
    static TABLE: LazyLock<[u64; STOP_SLOTS]> = LazyLock::new(|| {
        let mut table = [0; STOP_SLOTS];
        for key in STOPWORDS.iter().filter_map(|w| short_key(w)) {
            let mut i = stop_slot(key);
            while table[i] != 0 {
                i = (i + 1) % STOP_SLOTS;
            }
            table[i] = key;
        }
        table
    });
    let Some(key) = short_key(token) else {
        return false;
    };
    let mut i = stop_slot(key);
    loop {
        match TABLE[i] {
            0 => return false,
            k if k == key => return true,
            _ => i = (i + 1) % STOP_SLOTS,
        }
    }
}

/// Slots in the stopword table: a power of two, about twice the list.
const STOP_SLOTS: usize = 256;

fn stop_slot(key: u64) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % STOP_SLOTS
}

/// The bytes of a non-empty string of at most 8 bytes, as an integer.
fn short_key(s: &str) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut key = [0u8; 8];
    key.get_mut(..s.len())?.copy_from_slice(s.as_bytes());
    Some(u64::from_le_bytes(key))
}

/// A light English suffix stripper.
///
/// It conflates the inflections that matter for matching task wording against
/// tool descriptions: plurals (`files`, `queries`, `searches`), `-ing` and
/// `-ed` (`creating`, `created`), `-tion`/`-sion`/`-ator` nominalisations
/// (`generation`, `generator` → `generat`) and a final silent `e` (`create`).
/// It does not aim to produce words, only equal stems for related forms.
/// Tokens that are short, contain digits or non-ASCII letters are left alone.
pub fn stem(word: &str) -> String {
    let mut w = word.to_string();
    stem_in_place(&mut w);
    w
}

fn stem_in_place(w: &mut String) {
    if w.len() <= 3 || !w.bytes().all(|b| b.is_ascii_lowercase()) {
        return;
    }

    // Plurals.
    if w.ends_with("sses") || w.ends_with("xes") || w.ends_with("ches") || w.ends_with("shes") {
        w.truncate(w.len() - 2);
    } else if w.ends_with("ies") && w.len() > 4 {
        w.truncate(w.len() - 3);
        w.push('y');
    } else if w.ends_with('s') && !(w.ends_with("ss") || w.ends_with("us") || w.ends_with("is")) {
        w.pop();
    }

    // -ing / -ed, keeping a stem of at least three letters with a vowel.
    let strip = if w.ends_with("ing") {
        3
    } else if w.ends_with("ed") && !w.ends_with("eed") {
        2
    } else {
        0
    };
    if strip > 0 && w.len() - strip >= 3 && has_vowel(&w[..w.len() - strip]) {
        w.truncate(w.len() - strip);
        undouble(w);
        if strip == 2 && w.ends_with('i') {
            // copied → copy
            w.pop();
            w.push('y');
        }
    }

    // Nominalisations: generation/generator → generat, conversion → convers.
    if (w.ends_with("tion") || w.ends_with("sion")) && w.len() >= 6 {
        w.truncate(w.len() - 3);
    } else if w.ends_with("ator") && w.len() >= 6 {
        w.truncate(w.len() - 2);
    }

    // Silent e after a consonant: create → creat (matches creating → creat).
    if w.len() >= 4 && w.ends_with('e') && !is_vowel(w.as_bytes()[w.len() - 2]) {
        w.pop();
    }
}

fn is_vowel(b: u8) -> bool {
    matches!(b, b'a' | b'e' | b'i' | b'o' | b'u' | b'y')
}

fn has_vowel(s: &str) -> bool {
    s.bytes().any(is_vowel)
}

/// running → run, but calling → call, processing → process.
fn undouble(w: &mut String) {
    let b = w.as_bytes();
    if b.len() >= 2 {
        let (x, y) = (b[b.len() - 2], b[b.len() - 1]);
        if x == y && !is_vowel(y) && !matches!(y, b'l' | b's' | b'z') {
            w.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        analyze(text, &mut out);
        out
    }

    #[test]
    fn stopword_list_is_sorted_and_short() {
        assert!(STOPWORDS.windows(2).all(|w| w[0] < w[1]));
        assert!(STOPWORDS.len() < STOP_SLOTS / 2);
        assert!(STOPWORDS.iter().all(|w| w.len() <= 8 && is_stopword(w)));
        assert!(!is_stopword("") && !is_stopword("tool") && !is_stopword("withdraws"));
    }

    #[test]
    fn splits_identifier_styles() {
        assert_eq!(
            split_identifier("getCurrentTime"),
            ["get", "current", "time"]
        );
        assert_eq!(
            split_identifier("get_current_time"),
            ["get", "current", "time"]
        );
        assert_eq!(split_identifier("list-issues"), ["list", "issues"]);
        assert_eq!(split_identifier("HTTPServer2"), ["http", "server", "2"]);
        assert_eq!(split_identifier("fs.readFile"), ["fs", "read", "file"]);
        assert_eq!(
            split_identifier("github__create_PR"),
            ["github", "create", "pr"]
        );
        assert_eq!(split_identifier("listIDs"), ["list", "ids"]);
        assert_eq!(
            split_identifier("get-36kr-trending"),
            ["get", "36", "kr", "trending"]
        );
        assert_eq!(split_identifier("ABC"), ["abc"]);
        assert!(split_identifier("__--..").is_empty());
    }

    #[test]
    fn compounds_are_kept_alongside_parts() {
        assert_eq!(terms("DeepWiki"), ["deep", "wiki", "deepwiki"]);
        assert_eq!(terms("base64 encode"), ["bas", "base64", "encod"]);
    }

    #[test]
    fn drops_stopwords_and_punctuation() {
        assert_eq!(
            terms("Please, help me find the files!"),
            ["help", "find", "fil"]
        );
    }

    #[test]
    fn cjk_becomes_bigrams() {
        assert_eq!(terms("八字"), ["八字"]);
        assert_eq!(terms("必应搜索"), ["必应", "应搜", "搜索"]);
    }

    #[test]
    fn stems_related_forms_together() {
        let same = [
            ("create", "creating"),
            ("created", "creates"),
            ("generation", "generate"),
            ("generator", "generated"),
            ("query", "queries"),
            ("search", "searches"),
            ("file", "files"),
            ("run", "running"),
            ("copy", "copied"),
            ("process", "processing"),
            ("image", "images"),
        ];
        for (a, b) in same {
            assert_eq!(stem(a), stem(b), "{a} vs {b}");
        }
        assert_eq!(stem("status"), "status");
        assert_eq!(stem("access"), "access");
        assert_eq!(stem("mp3"), "mp3");
    }
}
