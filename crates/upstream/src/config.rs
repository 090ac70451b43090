use std::{collections::BTreeMap, fmt, path::PathBuf};

use serde::{Deserialize, Serialize};

/// What a stdio server inherits from the gateway's environment unless its
/// entry names more in `inherit_env`: the set the MCP SDKs pass by default.
pub const DEFAULT_INHERITED_ENV: &[&str] = &["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"];

/// The longest qualified tool name (`server__tool`) that models' APIs
/// accept everywhere.
const MAX_QUALIFIED_LEN: usize = 64;

/// One `[[servers]]` entry of the gateway config.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Stdio upstream: the program to spawn.
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment for the child. Values may use `${VAR}`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Variables of the gateway's own environment passed on to the child,
    /// besides [`crate::DEFAULT_INHERITED_ENV`]. Nothing else is inherited.
    #[serde(default)]
    pub inherit_env: Vec<String>,
    pub cwd: Option<PathBuf>,
    /// HTTP upstream (Streamable HTTP or legacy HTTP+SSE).
    pub url: Option<String>,
    /// How a `url` server is spoken to: `streamable_http`, `sse` (the
    /// 2024-11-05 transport), or `auto` (unset): Streamable HTTP, falling
    /// back to SSE when the first POST gets 400, 404 or 405.
    #[serde(default)]
    pub transport: Option<HttpTransport>,
    /// OpenAPI upstream: a document (a file, or an https URL) whose
    /// operations become tools, each call one HTTP request.
    pub openapi: Option<String>,
    /// Where an OpenAPI server's requests go; default: the document's first
    /// `servers` entry. May use `${VAR}`.
    #[serde(default)]
    pub base_url: Option<String>,
    /// Query parameters an OpenAPI server's every request carries (an API
    /// key). Values may use `${VAR}`; they are never logged.
    #[serde(default)]
    pub query: BTreeMap<String, String>,
    /// An OpenAPI server's operations to make tools of: globs over the
    /// operation id or `METHOD /path` (default: all)...
    #[serde(default)]
    pub include: Vec<String>,
    /// ...less those matching any of these.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Extra request headers. Values may use `${VAR}`; they are never logged.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The operator's switch for everyone: a disabled server is not
    /// started, listed or callable (`manifold servers disable`).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Connect at startup; otherwise on `enable_server` or first use.
    #[serde(default = "yes")]
    pub autoconnect: bool,
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    #[serde(default = "default_list_timeout_ms")]
    pub list_timeout_ms: u64,
    #[serde(default = "default_call_timeout_ms")]
    pub call_timeout_ms: u64,
    #[serde(default = "default_max_concurrency")]
    pub max_concurrency: usize,
    #[serde(default = "default_max_pages")]
    pub max_pages: usize,
    /// A result larger than this (serialized; tools, prompts, resources,
    /// completions) is refused rather than passed on to a model's context.
    #[serde(default = "default_max_result_bytes")]
    pub max_result_bytes: usize,
    /// Text content past this many characters is cut with a marker (the
    /// global `[governance] max_result_chars` when unset; 0: no limit).
    #[serde(default)]
    pub max_result_chars: Option<usize>,
    /// Freshness used when the upstream sends no `ttlMs`.
    #[serde(default = "default_ttl_ms")]
    pub default_ttl_ms: u64,
    /// Restart a crashed stdio child (with backoff).
    #[serde(default = "yes")]
    pub restart: bool,
    /// Its results are untrusted input (web pages, mail, public tickets): in
    /// code mode, a run that read them needs approval to write elsewhere.
    #[serde(default)]
    pub untrusted: bool,
    /// `"oauth"`: the gateway is an OAuth client of this (HTTP) server and
    /// sends the token it got by `manifold auth login NAME`.
    #[serde(default)]
    pub auth: Option<UpstreamAuth>,
    /// A client registered beforehand with the server's authorization
    /// server; without it the gateway registers itself dynamically.
    #[serde(default)]
    pub client_id: Option<String>,
    /// The environment variable holding that client's secret, if it has one.
    #[serde(default)]
    pub client_secret_env: Option<String>,
    /// Scopes to ask for at sign-in; default: what the server's metadata
    /// says.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// Whose token an `oauth` server's requests carry: the gateway's one
    /// sign-in (`shared`), or each caller's own (`per_principal`).
    #[serde(default)]
    pub credentials: Credentials,
    /// A caller's own connection (`per_principal`) closes after this long
    /// without a request.
    #[serde(default = "default_principal_idle_seconds")]
    pub principal_idle_seconds: u64,
    /// At most this many callers' own connections are open at once; the
    /// least recently used one makes way for a new one.
    #[serde(default = "default_max_principal_connections")]
    pub max_principal_connections: usize,
    /// Send a plain `tools/call` to a stateless (2026-07-28) HTTP upstream
    /// as one POST of the gateway's own instead of through rmcp's client
    /// (same wire, less CPU). Off: every request goes through rmcp.
    #[serde(default = "yes")]
    pub plain_calls: bool,
    /// Who put the server here: the operator's file, or the admin API
    /// (`origin = "runtime"`, written with the server when it is persisted).
    /// A runtime server's address is checked and pinned at every connect.
    #[serde(default)]
    pub origin: ServerOrigin,
    /// Hosts a runtime server may reach although they are, or resolve to,
    /// loopback, private or link-local addresses (`[admin] allowed_hosts`).
    #[serde(skip)]
    pub allowed_private_hosts: Vec<String>,
    /// `[[servers.tools]]`: the operator's renames, descriptions and hidden
    /// tools, applied to every listing of this server before it is indexed.
    #[serde(default)]
    pub tools: Vec<ToolOverride>,
}

/// One `[[servers.tools]]` entry: how callers see one upstream tool.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolOverride {
    /// The upstream's own name for the tool.
    pub name: String,
    /// The name callers see and call instead.
    #[serde(default)]
    pub rename: Option<String>,
    /// The description callers and search see instead of the upstream's.
    #[serde(default)]
    pub description: Option<String>,
    /// Not listed, searched, bound in code mode or callable by any path.
    #[serde(default)]
    pub hidden: bool,
}

/// The transport of a `url` server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HttpTransport {
    /// Decided at each connect: Streamable HTTP, else legacy SSE.
    #[default]
    Auto,
    StreamableHttp,
    /// The 2024-11-05 HTTP+SSE transport: a GET event stream names the
    /// endpoint the messages are POSTed to.
    Sse,
}

impl HttpTransport {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::StreamableHttp => "streamable_http",
            Self::Sse => "sse",
        }
    }
}

/// Where a `[[servers]]` entry came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerOrigin {
    /// Written by the operator: trusted to name any address.
    #[default]
    Config,
    /// Added through the admin API: its address is checked at every connect.
    Runtime,
}

/// How the gateway proves itself to an upstream beyond static headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamAuth {
    /// OAuth 2.1 authorization code with PKCE; tokens kept (sealed) in the
    /// store and refreshed before they expire and on a 401.
    Oauth,
    /// An openapi server's OAuth 2 client-credentials flow (the document's
    /// token URL, `client_id`, `client_secret_env`, `scopes`): the gateway's
    /// own token, kept in memory and fetched again before it expires and on
    /// a 401.
    OauthClientCredentials,
}

/// Whose OAuth token an upstream request carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Credentials {
    /// The gateway's own sign-in, for every caller.
    #[default]
    Shared,
    /// Each caller signs in once and its requests carry its own token, over
    /// a connection of its own.
    PerPrincipal,
}

fn default_principal_idle_seconds() -> u64 {
    600
}
fn default_max_principal_connections() -> usize {
    256
}
fn yes() -> bool {
    true
}
fn default_connect_timeout_ms() -> u64 {
    20_000
}
fn default_list_timeout_ms() -> u64 {
    10_000
}
fn default_call_timeout_ms() -> u64 {
    60_000
}
fn default_max_concurrency() -> usize {
    16
}
fn default_max_result_bytes() -> usize {
    16 * 1024 * 1024
}
fn default_max_pages() -> usize {
    100
}
fn default_ttl_ms() -> u64 {
    300_000
}

impl UpstreamConfig {
    /// A stdio upstream with defaults; handy for tests and code-built configs.
    pub fn stdio(name: &str, command: &str, args: &[&str]) -> Self {
        let mut config: UpstreamConfig =
            toml_like_default(name).expect("default upstream config is valid");
        config.command = Some(command.to_string());
        config.args = args.iter().map(|a| a.to_string()).collect();
        config
    }

    /// A Streamable HTTP upstream with defaults.
    pub fn http(name: &str, url: &str) -> Self {
        let mut config = toml_like_default(name).expect("default upstream config is valid");
        config.url = Some(url.to_string());
        config
    }

    pub fn validate(&self) -> Result<(), String> {
        let name_ok = !self.name.is_empty()
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(format!(
                "server name {:?} must be non-empty ASCII letters, digits, '_' or '-'",
                self.name
            ));
        }
        // `a_` + `x` and `a` + `_x` would both qualify to `a__x`.
        if self.name.starts_with('_') || self.name.ends_with('_') {
            return Err(format!(
                "server name {:?} must not start or end with '_' (qualified names would collide: `a_` + `x` and `a` + `_x` are both `a__x`)",
                self.name
            ));
        }
        if self.name.contains("__") {
            return Err(format!(
                "server name {:?} must not contain '__' (it separates server and tool)",
                self.name
            ));
        }
        let kinds = [
            self.command.is_some(),
            self.url.is_some(),
            self.openapi.is_some(),
        ];
        match kinds.iter().filter(|set| **set).count() {
            0 => Err(format!(
                "server '{}' needs one of command (stdio), url (HTTP) or openapi (an OpenAPI document)",
                self.name
            )),
            1 => Ok(()),
            _ => Err(format!(
                "server '{}' sets more than one of command, url and openapi; choose one",
                self.name
            )),
        }?;
        let openapi_only = self.base_url.is_some()
            || !self.query.is_empty()
            || !self.include.is_empty()
            || !self.exclude.is_empty();
        if self.openapi.is_none() && openapi_only {
            return Err(format!(
                "server '{}': base_url, query, include and exclude belong to an openapi server",
                self.name
            ));
        }
        if self.openapi.is_some()
            && (self.auth == Some(UpstreamAuth::Oauth) || self.credentials != Credentials::Shared)
        {
            return Err(format!(
                "server '{}': an openapi server signs in with its headers, query or auth = \"oauth_client_credentials\"; auth = \"oauth\" and credentials are not supported for it yet",
                self.name
            ));
        }
        if self.auth == Some(UpstreamAuth::OauthClientCredentials)
            && (self.openapi.is_none()
                || self.client_id.is_none()
                || self.client_secret_env.is_none())
        {
            return Err(format!(
                "server '{}': auth = \"oauth_client_credentials\" needs openapi, client_id and client_secret_env",
                self.name
            ));
        }
        if self.transport.is_some() && self.url.is_none() {
            return Err(format!(
                "server '{}': transport belongs to a server with a url",
                self.name
            ));
        }
        if self.auth == Some(UpstreamAuth::Oauth) && self.url.is_none() {
            return Err(format!(
                "server '{}': auth = \"oauth\" needs an HTTP url",
                self.name
            ));
        }
        if self.credentials == Credentials::PerPrincipal {
            if self.auth != Some(UpstreamAuth::Oauth) {
                return Err(format!(
                    "server '{}': credentials = \"per_principal\" needs auth = \"oauth\"",
                    self.name
                ));
            }
            if self.max_principal_connections == 0 || self.principal_idle_seconds == 0 {
                return Err(format!(
                    "server '{}': max_principal_connections and principal_idle_seconds must be at least 1",
                    self.name
                ));
            }
        }
        self.validate_tool_overrides()?;
        if self.max_concurrency == 0 || self.max_pages == 0 {
            return Err(format!(
                "server '{}': max_concurrency and max_pages must be at least 1",
                self.name
            ));
        }
        Ok(())
    }

    /// Each override names a tool once, does something, and renames to a
    /// name that qualifies unchanged and is taken by no other rename.
    fn validate_tool_overrides(&self) -> Result<(), String> {
        let mut named = std::collections::BTreeSet::new();
        let mut renamed = std::collections::BTreeSet::new();
        for o in &self.tools {
            let at = format!("server '{}', tool override '{}'", self.name, o.name);
            if o.name.is_empty() {
                return Err(format!(
                    "server '{}': a [[servers.tools]] entry needs the upstream tool's name",
                    self.name
                ));
            }
            if !named.insert(o.name.as_str()) {
                return Err(format!("{at}: the tool is named by more than one override"));
            }
            if o.rename.is_none() && o.description.is_none() && !o.hidden {
                return Err(format!(
                    "{at}: set rename, description or hidden = true (the entry changes nothing)"
                ));
            }
            if o.hidden && (o.rename.is_some() || o.description.is_some()) {
                return Err(format!(
                    "{at}: a hidden tool is never shown, so rename and description do nothing; remove them or hidden"
                ));
            }
            if let Some(rename) = &o.rename {
                let valid = !rename.is_empty()
                    && rename
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if !valid {
                    return Err(format!(
                        "{at}: rename {rename:?} must be non-empty ASCII letters, digits, '_' or '-'"
                    ));
                }
                // The qualified name must be the plain `server__rename`, not
                // a shortened one with a hash suffix.
                let qualified = self.name.len() + 2 + rename.len();
                if qualified > MAX_QUALIFIED_LEN {
                    return Err(format!(
                        "{at}: '{}__{rename}' is {qualified} characters; qualified names are at most {MAX_QUALIFIED_LEN}",
                        self.name
                    ));
                }
                if !renamed.insert(rename.as_str()) {
                    return Err(format!(
                        "{at}: another override of this server renames a tool to '{rename}' too"
                    ));
                }
            }
        }
        Ok(())
    }

    /// An OpenAPI upstream with defaults: `document` is a file or a URL.
    pub fn openapi(name: &str, document: &str) -> Self {
        let mut config = toml_like_default(name).expect("default upstream config is valid");
        config.openapi = Some(document.to_string());
        config
    }

    /// The configured transport: for a `url` server, what its entry asks
    /// for (`auto` until a connection decides).
    pub fn transport_kind(&self) -> &'static str {
        if self.openapi.is_some() {
            "openapi"
        } else if self.url.is_some() {
            self.transport.unwrap_or_default().as_str()
        } else {
            "stdio"
        }
    }
}

fn toml_like_default(name: &str) -> Result<UpstreamConfig, serde_json::Error> {
    serde_json::from_value(serde_json::json!({ "name": name }))
}

// Header values and env values may hold secrets: show only their keys.
impl fmt::Debug for UpstreamConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamConfig")
            .field("name", &self.name)
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env_keys", &self.env.keys().collect::<Vec<_>>())
            .field("url", &self.url)
            .field("transport", &self.transport)
            .field("openapi", &self.openapi)
            .field("query_keys", &self.query.keys().collect::<Vec<_>>())
            .field("header_keys", &self.headers.keys().collect::<Vec<_>>())
            .field("autoconnect", &self.autoconnect)
            .finish_non_exhaustive()
    }
}

/// Replace `${VAR}` with the variable's value. An unset variable is an error, so a
/// missing secret fails loudly at connect time instead of sending an empty header.
pub fn expand_env(value: &str) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err("unterminated ${ in config value".to_string());
        };
        let var = &after[..end];
        let val =
            std::env::var(var).map_err(|_| format!("environment variable {var} is not set"))?;
        out.push_str(&val);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_and_reports_missing_vars() {
        // SAFETY: single-threaded test setting a unique variable.
        unsafe { std::env::set_var("MANIFOLD_TEST_SECRET", "s3cret") };
        assert_eq!(
            expand_env("Bearer ${MANIFOLD_TEST_SECRET}").unwrap(),
            "Bearer s3cret"
        );
        assert!(
            expand_env("${MANIFOLD_SURELY_UNSET_VAR}")
                .unwrap_err()
                .contains("MANIFOLD_SURELY_UNSET_VAR")
        );
        assert!(expand_env("${oops").is_err());
    }

    #[test]
    fn debug_hides_secret_values() {
        let mut c = UpstreamConfig::http("t", "http://127.0.0.1:1/mcp");
        c.headers
            .insert("Authorization".into(), "Bearer hunter2".into());
        let shown = format!("{c:?}");
        assert!(shown.contains("Authorization"));
        assert!(!shown.contains("hunter2"));
    }

    #[test]
    fn validates_names_and_transport() {
        assert!(
            UpstreamConfig::stdio("ok-name_1", "x", &[])
                .validate()
                .is_ok()
        );
        assert!(
            UpstreamConfig::stdio("bad name", "x", &[])
                .validate()
                .is_err()
        );
        assert!(UpstreamConfig::stdio("a__b", "x", &[]).validate().is_err());
        let mut both = UpstreamConfig::stdio("x", "x", &[]);
        both.url = Some("http://127.0.0.1/".into());
        assert!(both.validate().is_err());
        let mut stdio_sse = UpstreamConfig::stdio("x", "x", &[]);
        stdio_sse.transport = Some(HttpTransport::Sse);
        assert!(stdio_sse.validate().is_err(), "transport needs a url");
        let mut http = UpstreamConfig::http("x", "http://127.0.0.1/sse");
        assert_eq!(http.transport_kind(), "auto");
        http.transport = Some(HttpTransport::Sse);
        assert!(http.validate().is_ok());
        assert_eq!(http.transport_kind(), "sse");
    }

    #[test]
    fn an_openapi_server_is_one_kind_with_its_own_settings() {
        let openapi = UpstreamConfig::openapi("shop", "shop.yaml");
        assert!(openapi.validate().is_ok());
        assert_eq!(openapi.transport_kind(), "openapi");
        let mut two = openapi.clone();
        two.url = Some("http://127.0.0.1/mcp".into());
        assert!(two.validate().unwrap_err().contains("more than one of"));
        let mut oauth = openapi.clone();
        oauth.auth = Some(UpstreamAuth::Oauth);
        assert!(oauth.validate().unwrap_err().contains("not supported"));
        oauth.auth = Some(UpstreamAuth::OauthClientCredentials);
        assert!(
            oauth
                .validate()
                .unwrap_err()
                .contains("needs openapi, client_id")
        );
        oauth.client_id = Some("gateway".into());
        oauth.client_secret_env = Some("SHOP_SECRET".into());
        assert!(oauth.validate().is_ok());
        let mut mcp = UpstreamConfig::http("x", "http://127.0.0.1/mcp");
        mcp.auth = Some(UpstreamAuth::OauthClientCredentials);
        mcp.client_id = Some("gateway".into());
        mcp.client_secret_env = Some("SHOP_SECRET".into());
        assert!(mcp.validate().unwrap_err().contains("needs openapi"));
        let mut stray = UpstreamConfig::http("x", "http://127.0.0.1/mcp");
        stray.base_url = Some("https://api.example.com".into());
        assert!(
            stray
                .validate()
                .unwrap_err()
                .contains("belong to an openapi server")
        );
        let mut none = openapi;
        none.openapi = None;
        assert!(none.validate().unwrap_err().contains("needs one of"));
        let mut keyed = UpstreamConfig::openapi("shop", "shop.yaml");
        keyed.query.insert("api_key".into(), "hunter2".into());
        let shown = format!("{keyed:?}");
        assert!(
            shown.contains("api_key") && !shown.contains("hunter2"),
            "{shown}"
        );
    }

    /// `a_` + `x` and `a` + `_x` both qualify to `a__x`: such names are
    /// refused, with the reason.
    #[test]
    fn names_that_could_collide_when_qualified_are_refused() {
        for name in ["a_", "_a", "_", "tickets_"] {
            let error = UpstreamConfig::stdio(name, "x", &[])
                .validate()
                .expect_err(name);
            assert!(error.contains("must not start or end with '_'"), "{error}");
        }
        assert!(UpstreamConfig::stdio("a_b", "x", &[]).validate().is_ok());
    }

    #[test]
    fn tool_overrides_say_what_is_wrong_with_them() {
        let with = |tools: serde_json::Value| {
            let mut config = UpstreamConfig::stdio("files", "x", &[]);
            config.tools = serde_json::from_value(tools).expect("overrides parse");
            config.validate()
        };
        assert!(
            with(serde_json::json!([
                {"name": "delete", "hidden": true},
                {"name": "read", "rename": "read_file", "description": "Reads one file."},
                {"name": "write", "description": "Writes one file."}
            ]))
            .is_ok()
        );
        let refused = [
            (serde_json::json!([{"name": "read"}]), "changes nothing"),
            (
                serde_json::json!([{"name": "read", "rename": "a"}, {"name": "read", "hidden": true}]),
                "more than one override",
            ),
            (
                serde_json::json!([{"name": "read", "rename": "x"}, {"name": "list", "rename": "x"}]),
                "renames a tool to 'x' too",
            ),
            (
                serde_json::json!([{"name": "read", "rename": "read file"}]),
                "ASCII letters",
            ),
            (
                serde_json::json!([{"name": "read", "rename": "r".repeat(60)}]),
                "at most 64",
            ),
            (
                serde_json::json!([{"name": "read", "hidden": true, "rename": "r"}]),
                "hidden tool is never shown",
            ),
            (
                serde_json::json!([{"name": "", "hidden": true}]),
                "needs the upstream tool's name",
            ),
        ];
        for (tools, says) in refused {
            let error = with(tools.clone()).expect_err(&tools.to_string());
            assert!(error.contains(says), "{tools}: {error}");
        }
        let unknown: Result<Vec<ToolOverride>, _> =
            serde_json::from_value(serde_json::json!([{"name": "read", "title": "x"}]));
        assert!(unknown.is_err(), "unknown keys are refused");
    }
}
