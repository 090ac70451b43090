use std::sync::OnceLock;

use tiktoken_rs::CoreBPE;

fn encoder() -> &'static CoreBPE {
    static ENCODER: OnceLock<CoreBPE> = OnceLock::new();
    ENCODER.get_or_init(|| tiktoken_rs::o200k_base().expect("o200k tables are bundled"))
}

/// Tokens of `text` under o200k, the tokenizer of current OpenAI models; a fair
/// stand-in for what a tool definition costs in any model's context.
pub fn count_tokens(text: &str) -> usize {
    encoder().encode_ordinary(text).len()
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_real_tokens() {
        assert_eq!(super::count_tokens(""), 0);
        let n = super::count_tokens("Get the current time in a timezone");
        assert!((5..=12).contains(&n), "{n}");
    }
}
