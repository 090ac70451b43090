//! The whole config file: reading it, checking it, and what follows from it
//! (the database URL, whether auth is on, what is weakened).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use manifold_upstream::UpstreamConfig;
use serde::Deserialize;

use crate::{
    AdminSection, AdmissionSection, AuthSection, CodeModeSection, GatewayConfig, GovernanceSection,
    LogFormat, LogSection, PolicySeed, SandboxSetting, SearchSection, StoreConfig,
    TelemetrySection,
};

/// A `manifold.toml`: every section, each with its defaults.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub gateway: GatewayConfig,
    #[serde(default)]
    pub store: StoreConfig,
    #[serde(default)]
    pub auth: AuthSection,
    #[serde(default)]
    pub admission: AdmissionSection,
    #[serde(default)]
    pub governance: GovernanceSection,
    #[serde(default)]
    pub code_mode: CodeModeSection,
    #[serde(default)]
    pub admin: AdminSection,
    #[serde(default)]
    pub search: SearchSection,
    /// Checked here with the rest; read before the config loads (logging
    /// starts first) by [`Config::log_format_of`].
    #[serde(default)]
    #[allow(dead_code)]
    pub log: LogSection,
    /// Checked here too; read before the config loads by
    /// [`Config::telemetry_of`], since traces start with logging.
    #[serde(default)]
    #[allow(dead_code)]
    pub telemetry: TelemetrySection,
    /// `manifold export`, `GET /export` and the provider search formats.
    #[serde(default)]
    pub export: manifold_export::ExportConfig,
    /// Rules seeded into the store at start (added if no identical rule is
    /// there yet; never removed: the store is the source of truth).
    #[serde(default)]
    pub policies: Vec<PolicySeed>,
    #[serde(default)]
    pub servers: Vec<UpstreamConfig>,
    /// The folder the config file is in; relative paths resolve against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

impl Config {
    /// The `[log] format` of a config's text, if it names one; used before
    /// logging starts, so it never fails.
    pub fn log_format_of(text: &str) -> Option<LogFormat> {
        #[derive(Deserialize)]
        struct LogOnly {
            log: LogSection,
        }
        let only: LogOnly = toml::from_str(text).ok()?;
        Some(only.log.format)
    }

    /// The `[telemetry]` section of a config's text (default if missing or
    /// unreadable); used before logging starts, so it never fails.
    pub fn telemetry_of(text: &str) -> TelemetrySection {
        #[derive(Deserialize)]
        struct TelemetryOnly {
            #[serde(default)]
            telemetry: TelemetrySection,
        }
        toml::from_str::<TelemetryOnly>(text)
            .map(|only| only.telemetry)
            .unwrap_or_default()
    }

    /// Read and check a config file. Relative commands and working directories
    /// resolve against the file's folder, so a config works from anywhere.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        // `Path::new("m.toml").parent()` is `Some("")`: treat that as ".".
        let base = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let base = std::fs::canonicalize(&base).unwrap_or(base);
        Self::parse(&text, base).with_context(|| format!("invalid config {}", path.display()))
    }

    /// Parse and check a config's text; relative paths resolve against `base`.
    pub fn parse(text: &str, base: PathBuf) -> anyhow::Result<Self> {
        let mut config: Config = toml::from_str(text)?;
        config.base_dir = base.clone();
        let mut seen = std::collections::HashSet::new();
        for server in &mut config.servers {
            server.validate().map_err(anyhow::Error::msg)?;
            if server.origin == manifold_upstream::ServerOrigin::Runtime {
                server.allowed_private_hosts = config.admin.allowed_hosts.clone();
            }
            if !seen.insert(server.name.clone()) {
                bail!("server name '{}' appears twice", server.name);
            }
            if server.command.is_some() {
                server.cwd = Some(match server.cwd.take() {
                    Some(cwd) if cwd.is_relative() => base.join(cwd),
                    Some(cwd) => cwd,
                    None => base.clone(),
                });
                server.command = server.command.take().map(|c| resolve_command(&c, &base));
            }
            if let Some(document) = &server.openapi
                && !document.contains("://")
                && Path::new(document).is_relative()
            {
                server.openapi = Some(base.join(document).display().to_string());
            }
        }
        config
            .governance
            .default_effect()
            .context("invalid [governance]")?;
        config
            .governance
            .audit_commit()
            .context("invalid [governance]")?;
        for (i, seed) in config.policies.iter().enumerate() {
            seed.to_new_policy()
                .with_context(|| format!("invalid [[policies]] entry {}", i + 1))?;
        }
        if config.gateway.public_url.is_none()
            && let Some(server) = config
                .servers
                .iter()
                .find(|s| s.credentials == manifold_upstream::Credentials::PerPrincipal)
        {
            bail!(
                "server '{}': credentials = \"per_principal\" needs [gateway] public_url: each caller's sign-in returns to <public_url>/oauth/callback",
                server.name
            );
        }
        if let Some(oidc) = &config.auth.oidc {
            let Some(resource_url) = &config.auth.resource_url else {
                bail!(
                    "[auth.oidc] needs [auth] resource_url: the gateway's public /mcp URL, which access tokens must name as their audience"
                );
            };
            oidc.callers(resource_url).context("invalid [auth.oidc]")?;
        }
        if !(config.gateway.threshold_percent > 0.0 && config.gateway.threshold_percent <= 100.0) {
            bail!("gateway.threshold_percent must be in (0, 100]");
        }
        Ok(config)
    }
}

impl Config {
    /// The database URL: `MANIFOLD_DATABASE_URL`, else `store.database_url`,
    /// else a SQLite file in the data dir.
    pub fn database_url(&self) -> String {
        if let Ok(url) = std::env::var("MANIFOLD_DATABASE_URL")
            && !url.trim().is_empty()
        {
            return url;
        }
        if let Some(url) = &self.store.database_url {
            return url.clone();
        }
        manifold_store::sqlite_url(&self.data_dir().join(manifold_store::SQLITE_FILE_NAME))
    }

    pub fn data_dir(&self) -> PathBuf {
        match &self.store.data_dir {
            Some(dir) if dir.is_absolute() => dir.clone(),
            Some(dir) => self.base_dir.join(dir),
            None => self.base_dir.join(".manifold"),
        }
    }

    /// Whether `/mcp` needs a gateway token when listening on `listen`.
    pub fn auth_required(&self, listen: &str) -> bool {
        self.auth.required.unwrap_or_else(|| !is_loopback(listen))
    }

    /// The security-relevant settings that are off or weakened, as
    /// (setting, why it matters), for `manifold doctor`.
    pub fn security_warnings(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let listen = &self.gateway.listen;
        if !is_loopback(listen) && !self.auth_required(listen) {
            out.push((
                "auth.required",
                format!("auth is off on {listen}, which is not a loopback address: anyone who can reach it can call every tool"),
            ));
        }
        if self.admin.allow_runtime_servers {
            out.push((
                "admin.allow_runtime_servers",
                format!(
                    "admin tokens may add servers at run time (commands matching {:?}; hosts {:?} besides public ones)",
                    self.admin.allowed_commands, self.admin.allowed_hosts
                ),
            ));
        }
        let code = &self.code_mode;
        if code.enabled {
            if code.sandbox == SandboxSetting::InProcess {
                out.push((
                    "code_mode.sandbox",
                    "scripts run in the gateway's process, with no isolation layer".into(),
                ));
            } else {
                let off: Vec<&str> = [
                    ("network_namespace", code.network_namespace),
                    ("landlock", code.landlock),
                    ("seccomp", code.seccomp),
                ]
                .into_iter()
                .filter(|(_, on)| !on)
                .map(|(name, _)| name)
                .collect();
                if !off.is_empty() {
                    out.push((
                        "code_mode isolation",
                        format!("isolation layers turned off: {}", off.join(", ")),
                    ));
                }
                if !code.require_isolation {
                    out.push((
                        "code_mode.require_isolation",
                        "scripts run even when an isolation layer is inactive on this host".into(),
                    ));
                }
            }
        }
        if self.governance.approval_elicitation {
            out.push((
                "governance.approval_elicitation",
                "the taint rule may ask a caller's own client to confirm its script's cross-server write".into(),
            ));
        }
        if self.governance.audit_commit == "async" {
            out.push((
                "governance.audit_commit",
                "replies do not wait for their audit rows; a crash can lose the last few milliseconds of them".into(),
            ));
        }
        if !self.governance.mask_secrets {
            out.push((
                "governance.mask_secrets",
                "secrets in tool results reach the model unmasked".into(),
            ));
        }
        out
    }

    /// Opens the governance store the config names, creating the SQLite data
    /// dir if needed and applying migrations.
    pub async fn open_store(&self) -> anyhow::Result<manifold_store::Store> {
        let url = self.database_url();
        if url.starts_with("sqlite:") && self.store.database_url.is_none() {
            let dir = self.data_dir();
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create data dir {}", dir.display()))?;
        }
        manifold_store::Store::connect(&url)
            .await
            .context("cannot open the governance store")
    }
}

fn is_loopback(listen: &str) -> bool {
    let host = match listen.rsplit_once(':') {
        Some((host, _)) => host,
        None => listen,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A bare command name is looked up next to the `manifold` binary first (where
/// the fixture servers are built), then on `PATH`; a relative path is taken
/// from the config's folder.
fn resolve_command(command: &str, base: &Path) -> String {
    if command.contains('/') {
        let p = Path::new(command);
        return if p.is_relative() {
            base.join(p).to_string_lossy().into_owned()
        } else {
            command.to_string()
        };
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        let candidate = dir.join(command);
        if candidate.is_file() {
            return candidate.to_string_lossy().into_owned();
        }
    }
    command.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ModeSetting;

    /// `manifold doctor`'s list: each weakened setting is named, and a
    /// default loopback gateway has only the (default-on) elicitation.
    #[test]
    fn security_warnings_name_each_weakened_setting() {
        let names = |text: &str| -> Vec<&'static str> {
            let config: Config = toml::from_str(text).unwrap();
            config
                .security_warnings()
                .into_iter()
                .map(|(n, _)| n)
                .collect()
        };
        assert_eq!(names(""), ["governance.approval_elicitation"]);
        let weakened = names(
            "[gateway]\nlisten = \"0.0.0.0:8080\"\n[auth]\nrequired = false\n\
             [admin]\nallow_runtime_servers = true\n\
             [code_mode]\nrequire_isolation = false\nseccomp = false\n\
             [governance]\nmask_secrets = false\napproval_elicitation = false",
        );
        assert_eq!(
            weakened,
            [
                "auth.required",
                "admin.allow_runtime_servers",
                "code_mode isolation",
                "code_mode.require_isolation",
                "governance.mask_secrets",
            ]
        );
        assert_eq!(
            names(
                "[code_mode]\nsandbox = \"in_process\"\n[governance]\napproval_elicitation = false"
            ),
            ["code_mode.sandbox"]
        );
        // Auth off is only a warning off loopback.
        assert!(names("[auth]\nrequired = false").len() == 1);
    }

    #[test]
    fn auth_is_on_off_loopback() {
        let config: Config = toml::from_str("").unwrap();
        assert!(!config.auth_required("127.0.0.1:8080"));
        assert!(!config.auth_required("[::1]:8080"));
        assert!(!config.auth_required("localhost:1"));
        assert!(config.auth_required("0.0.0.0:8080"));
        assert!(config.auth_required("192.168.1.4:8080"));
        let config: Config = toml::from_str("[auth]\nrequired = true").unwrap();
        assert!(config.auth_required("127.0.0.1:8080"));
    }

    #[test]
    fn per_principal_credentials_need_oauth_and_a_public_url() {
        let parse = |text: &str| Config::parse(text, PathBuf::from("/tmp"));
        let server = "[[servers]]\nname = \"t\"\nurl = \"https://t.example/mcp\"\ncredentials = \"per_principal\"\n";
        let error = parse(server).unwrap_err();
        assert!(
            format!("{error:#}").contains("needs auth = \"oauth\""),
            "{error:#}"
        );
        let oauth = format!("{server}auth = \"oauth\"\n");
        let error = parse(&oauth).unwrap_err();
        assert!(format!("{error:#}").contains("public_url"), "{error:#}");
        let config = parse(&format!(
            "[gateway]\npublic_url = \"https://gw.example\"\n{oauth}max_principal_connections = 8\n"
        ))
        .unwrap();
        assert_eq!(config.servers[0].max_principal_connections, 8);
        assert_eq!(config.servers[0].principal_idle_seconds, 600);
        let error = parse(&format!(
            "[gateway]\npublic_url = \"https://gw.example\"\n{oauth}max_principal_connections = 0\n"
        ))
        .unwrap_err();
        assert!(format!("{error:#}").contains("at least 1"), "{error:#}");
    }

    #[test]
    fn oidc_needs_the_resource_url_and_says_what_is_wrong() {
        let parse = |text: &str| Config::parse(text, PathBuf::from("/tmp"));
        let error = parse("[auth.oidc]\nissuer = \"https://id.example\"").unwrap_err();
        assert!(format!("{error:#}").contains("resource_url"), "{error:#}");
        let base =
            "[auth]\nresource_url = \"https://gw/mcp\"\n[auth.oidc]\nissuer = \"https://id\"\n";
        let config = parse(base).unwrap();
        let callers = config
            .auth
            .oidc
            .as_ref()
            .unwrap()
            .callers("https://gw/mcp")
            .unwrap();
        // No mapping: the gateway's default (the binary's settings test
        // names its scopes).
        assert!(callers.scopes.is_none());
        let mapped = parse(&format!(
            "{base}[auth.oidc.scopes]\n\"mcp:all\" = [\"discover\", \"call\"]\n\"mcp:read\" = \"discover\""
        ))
        .unwrap();
        let callers = mapped.auth.oidc.unwrap().callers("https://gw/mcp").unwrap();
        assert_eq!(callers.scopes.unwrap()["mcp:all"].len(), 2);
        let error = parse(&format!("{base}algorithms = [\"HS256\"]")).unwrap_err();
        assert!(format!("{error:#}").contains("symmetric"), "{error:#}");
        let error = parse(&format!("{base}[auth.oidc.scopes]\n\"x\" = \"fly\"")).unwrap_err();
        assert!(format!("{error:#}").contains("fly"), "{error:#}");
    }

    #[test]
    fn policy_seeds_parse_or_say_why() {
        let config: Config = toml::from_str(
            "[[policies]]\neffect = \"rate_limit\"\nlimit = 5\nwindow_seconds = 60\ntier = \"write\"\n\
             [[policies]]\neffect = \"deny\"\nprincipal = \"group:interns\"\nserver = \"prod-*\"",
        )
        .unwrap();
        assert!(config.policies.iter().all(|p| p.to_new_policy().is_ok()));
        let bad = PolicySeed {
            effect: "rate_limit".into(),
            limit: None,
            ..config.policies[0].clone()
        };
        assert!(format!("{:#}", bad.to_new_policy().unwrap_err()).contains("window_seconds"));
        let bad = PolicySeed {
            effect: "maybe".into(),
            ..config.policies[0].clone()
        };
        assert!(format!("{:#}", bad.to_new_policy().unwrap_err()).contains("require_approval"));
    }

    #[test]
    fn parses_the_documented_example() {
        let dir = std::env::temp_dir().join(format!("manifold-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.toml");
        std::fs::write(
            &path,
            r#"
[gateway]
listen = "127.0.0.1:8080"
mode = "auto"
context_window_tokens = 200000
threshold_percent = 2.0

[[servers]]
name = "time"
description = "Current time and timezone conversion"
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]
env = { TZ = "UTC" }
autoconnect = true

[[servers]]
name = "tickets"
description = "Issue tracker"
url = "http://127.0.0.1:9000/mcp"
headers = { Authorization = "Bearer ${TICKETS_TOKEN}" }
"#,
        )
        .unwrap();
        let config = Config::load(&path).unwrap();
        assert_eq!(config.servers.len(), 2);
        assert_eq!(config.gateway.mode, ModeSetting::Auto);
        assert_eq!(
            config.servers[0].cwd.as_deref(),
            Some(std::fs::canonicalize(&dir).unwrap().as_path())
        );
        std::fs::write(&path, "[gateway]\nmode = \"sideways\"\n").unwrap();
        let err = format!("{:#}", Config::load(&path).unwrap_err());
        assert!(err.contains("sideways") || err.contains("mode"), "{err}");
        std::fs::write(&path, "[[servers]]\nname = \"a\"\ncommand = \"x\"\n[[servers]]\nname = \"a\"\ncommand = \"y\"\n").unwrap();
        assert!(format!("{:#}", Config::load(&path).unwrap_err()).contains("twice"));
    }

    #[test]
    fn an_openapi_file_is_found_beside_the_config_and_a_url_is_left_alone() {
        let text = "[[servers]]\nname = \"shop\"\nopenapi = \"specs/shop.yaml\"\n\n\
                    [[servers]]\nname = \"saas\"\nopenapi = \"https://api.example.com/openapi.json\"\n\
                    base_url = \"https://api.example.com/v2\"\nquery = { key = \"${SAAS_KEY}\" }\n";
        let config = Config::parse(text, PathBuf::from("/etc/manifold")).unwrap();
        assert_eq!(
            config.servers[0].openapi.as_deref(),
            Some("/etc/manifold/specs/shop.yaml")
        );
        assert_eq!(
            config.servers[1].openapi.as_deref(),
            Some("https://api.example.com/openapi.json")
        );
        assert_eq!(config.servers[1].query["key"], "${SAAS_KEY}");
    }
}
