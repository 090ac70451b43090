//! A tool's description as one line: what compact listings and the
//! evaluation's candidate lists show of it.

/// Longest line, in characters, a summary keeps.
const MAX: usize = 160;

/// The first sentence of a description's first non-empty line, cut to
/// [`MAX`] characters with an ellipsis.
pub fn one_line(description: &str) -> String {
    let line = description
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    let sentence = match line.find(". ") {
        Some(i) if i < MAX => &line[..=i],
        _ => line,
    };
    if sentence.chars().count() <= MAX {
        sentence.to_string()
    } else {
        let cut: String = sentence.chars().take(MAX - 1).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn one_line_takes_first_sentence() {
        assert_eq!(one_line("Get time. Also converts."), "Get time.");
        assert_eq!(one_line("\n  First line\nsecond"), "First line");
        let long = "x".repeat(400);
        assert_eq!(one_line(&long).chars().count(), 160);
    }
}
