//! An access token's claims, read into who the caller is.

use serde_json::{Map, Value};

use crate::{OidcSettings, Rejected};

/// A verified access token: the user, its groups and its OAuth scopes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The principal claim's value.
    pub subject: String,
    pub groups: Vec<String>,
    /// From `scope` (space-separated, RFC 9068) or `scp` (a list).
    pub scopes: Vec<String>,
    /// `exp`, in Unix milliseconds.
    pub expires_at_ms: i64,
}

/// The longest user id or group name taken from a token.
const MAX_NAME: usize = 512;

pub(crate) fn read(
    settings: &OidcSettings,
    claims: &Map<String, Value>,
) -> Result<Verified, Rejected> {
    let missing = || Rejected::Claim(settings.principal_claim.clone());
    let subject = match claims.get(&settings.principal_claim) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => return Err(missing()),
    };
    if subject.is_empty() || subject.len() > MAX_NAME || subject.chars().any(char::is_control) {
        return Err(missing());
    }
    let groups = match settings.groups_claim.as_ref().and_then(|c| claims.get(c)) {
        None | Some(Value::Null) => Vec::new(),
        Some(value) => names(value)
            .ok_or_else(|| Rejected::Claim(settings.groups_claim.clone().unwrap_or_default()))?,
    };
    let scopes = match (claims.get("scope"), claims.get("scp")) {
        (Some(value), _) | (None, Some(value)) => {
            names(value).ok_or_else(|| Rejected::Claim("scope".into()))?
        }
        (None, None) => Vec::new(),
    };
    let expires_at_ms = claims
        .get("exp")
        .and_then(Value::as_i64)
        .ok_or_else(|| Rejected::Claim("exp".into()))?
        .saturating_mul(1000);
    Ok(Verified {
        subject,
        groups,
        scopes,
        expires_at_ms,
    })
}

/// A list of names: a JSON array of strings, or one space-separated string.
fn names(value: &Value) -> Option<Vec<String>> {
    let list: Vec<String> = match value {
        Value::String(s) => s.split_whitespace().map(str::to_string).collect(),
        Value::Array(items) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<_>>()?,
        _ => return None,
    };
    Some(
        list.into_iter()
            .filter(|n| !n.is_empty() && n.len() <= MAX_NAME)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claims(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn subject_groups_and_scopes_in_the_forms_providers_use() {
        let settings = OidcSettings::new("https://id", "https://gw/mcp");
        let verified = read(
            &settings,
            &claims(json!({"sub": "alice", "groups": ["eng", "ops"], "scope": "manifold:call  manifold:discover", "exp": 10})),
        )
        .unwrap();
        assert_eq!(verified.subject, "alice");
        assert_eq!(verified.groups, ["eng", "ops"]);
        assert_eq!(verified.scopes, ["manifold:call", "manifold:discover"]);
        assert_eq!(verified.expires_at_ms, 10_000);
        let okta = read(
            &settings,
            &claims(json!({"sub": 42, "scp": ["manifold:call"], "exp": 1})),
        )
        .unwrap();
        assert_eq!((okta.subject.as_str(), okta.scopes.len()), ("42", 1));
        assert!(okta.groups.is_empty());
    }

    #[test]
    fn a_missing_or_odd_claim_is_a_clear_refusal() {
        let mut settings = OidcSettings::new("https://id", "https://gw/mcp");
        settings.principal_claim = "email".into();
        assert_eq!(
            read(&settings, &claims(json!({"sub": "a", "exp": 1}))),
            Err(Rejected::Claim("email".into()))
        );
        assert_eq!(
            read(
                &settings,
                &claims(json!({"email": "a@x", "groups": [1], "exp": 1}))
            ),
            Err(Rejected::Claim("groups".into()))
        );
        assert_eq!(
            read(&settings, &claims(json!({"email": "", "exp": 1}))),
            Err(Rejected::Claim("email".into()))
        );
    }
}
