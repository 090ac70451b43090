//! Who may use `/mcp`: `[auth]` and `[auth.oidc]`.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, bail};
use manifold_identity::AccessTokenVerifier;
use manifold_store::Action;
use serde::Deserialize;

/// Who may use `/mcp`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSection {
    /// Require a gateway token. Unset: required whenever `listen` is not a
    /// loopback address.
    pub required: Option<bool>,
    /// The public URL of `/mcp`, for RFC 9728 metadata behind a proxy, and
    /// the audience access tokens from the identity provider must name.
    pub resource_url: Option<String>,
    /// Callers may sign in with this OpenID provider.
    pub oidc: Option<OidcSection>,
}

/// `[auth.oidc]`: the gateway as an OAuth resource server for callers.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcSection {
    /// The provider's issuer URL, exactly as its tokens carry it.
    pub issuer: String,
    /// The claim that names the user; it becomes principal `user:<value>`.
    #[serde(default = "default_principal_claim")]
    pub principal_claim: String,
    /// The claim listing the user's groups (`group:<g>` in policies); `""`
    /// for none.
    #[serde(default = "default_groups_claim")]
    pub groups_claim: String,
    /// OAuth scope → the action (or actions) it grants. Default:
    /// `manifold:discover`, `manifold:call`, `manifold:code`,
    /// `manifold:admin`.
    #[serde(default)]
    pub scopes: Option<BTreeMap<String, OneOrMany>>,
    /// Accepted signature algorithms (asymmetric only). Default: RS, PS and
    /// ES families.
    #[serde(default)]
    pub algorithms: Option<Vec<String>>,
    /// Clock skew allowed on `exp` and `nbf`.
    #[serde(default = "default_leeway_seconds")]
    pub leeway_seconds: u64,
    /// How long the provider's keys are used before they are read again (a
    /// token with an unknown key id re-reads them sooner).
    #[serde(default = "default_jwks_refresh_seconds")]
    pub jwks_refresh_seconds: u64,
}

/// One action or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

fn default_principal_claim() -> String {
    "sub".into()
}
fn default_groups_claim() -> String {
    "groups".into()
}
fn default_leeway_seconds() -> u64 {
    60
}
fn default_jwks_refresh_seconds() -> u64 {
    300
}

/// `[auth.oidc]` checked: the verifier of callers' access tokens, and the
/// OAuth scope → actions mapping when the section sets one.
#[derive(Debug)]
pub struct OidcCallerSettings {
    pub verifier: AccessTokenVerifier,
    /// `None`: the gateway's default mapping (`manifold:<action>`).
    pub scopes: Option<BTreeMap<String, BTreeSet<Action>>>,
}

impl OidcSection {
    /// The verifier and scope mapping these settings describe; `audience`
    /// is `[auth] resource_url`.
    pub fn callers(&self, audience: &str) -> anyhow::Result<OidcCallerSettings> {
        let mut settings = manifold_identity::OidcSettings::new(&self.issuer, audience);
        settings.principal_claim = self.principal_claim.clone();
        settings.groups_claim = Some(self.groups_claim.clone()).filter(|c| !c.is_empty());
        if let Some(names) = &self.algorithms {
            settings.algorithms = names
                .iter()
                .map(|n| manifold_identity::parse_algorithm(n).map_err(anyhow::Error::msg))
                .collect::<anyhow::Result<_>>()?;
            if settings.algorithms.is_empty() {
                bail!("auth.oidc.algorithms is empty");
            }
        }
        settings.leeway = std::time::Duration::from_secs(self.leeway_seconds);
        settings.jwks_refresh = std::time::Duration::from_secs(self.jwks_refresh_seconds.max(1));
        let scopes = match &self.scopes {
            None => None,
            Some(map) => Some(
                map.iter()
                    .map(|(scope, actions)| {
                        let names = match actions {
                            OneOrMany::One(one) => vec![one.clone()],
                            OneOrMany::Many(many) => many.clone(),
                        };
                        let actions = names
                            .iter()
                            .map(|n| n.parse::<Action>().map_err(anyhow::Error::from))
                            .collect::<anyhow::Result<_>>()
                            .with_context(|| format!("auth.oidc.scopes.{scope:?}"))?;
                        Ok((scope.clone(), actions))
                    })
                    .collect::<anyhow::Result<_>>()?,
            ),
        };
        Ok(OidcCallerSettings {
            verifier: AccessTokenVerifier::new(settings).map_err(anyhow::Error::msg)?,
            scopes,
        })
    }
}
