//! The principal a bearer token names, for upstream caches.

use manifold_catalog::Principal;
use sha2::{Digest, Sha256};

/// The authorization context of a bearer token. Only a digest is kept, so the
/// token itself never reaches logs or caches, and it is never sent upstream.
pub fn principal_from_token(token: Option<&str>) -> Principal {
    match token.map(str::trim).filter(|t| !t.is_empty()) {
        None => Principal::anonymous(),
        Some(t) => Principal(format!(
            "bearer:{}",
            &hex::encode(Sha256::digest(t.as_bytes()))[..16]
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_tokens_distinct_principals() {
        let a = principal_from_token(Some("alpha"));
        let b = principal_from_token(Some("beta"));
        assert_ne!(a, b);
        assert_eq!(a, principal_from_token(Some("alpha")));
        assert_eq!(principal_from_token(None), Principal::anonymous());
        assert!(!a.0.contains("alpha"));
    }
}
