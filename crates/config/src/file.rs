//! Editing a config file in place: `manifold init`, `manifold servers …`,
//! `manifold import --write` and the console's server forms all change
//! `[[servers]]` through these functions, with `toml_edit`, so the
//! operator's comments, order and formatting survive. Every edit is checked
//! by loading the result as a config before it is written; a file that would
//! not load is never written.

use std::path::Path;

use anyhow::{Context, bail};
use toml_edit::{Array, ArrayOfTables, DocumentMut, InlineTable, Item, Table, value};

use crate::Config;

/// The starter config `manifold init` writes: it loads and serves as it is
/// (one stdio server that needs nothing installed: the gateway's own demo
/// fixture is not assumed, so the example server is commented out).
pub const STARTER: &str = r#"# Manifold: one MCP endpoint in front of many MCP servers.
# Every key has a default; this file shows the ones operators change first.
# Reference: docs/configuration.md in the Manifold repository.

[gateway]
listen = "127.0.0.1:8080"     # Streamable HTTP at /mcp
mode = "auto"                 # auto | direct | progressive (meta-tools above the token threshold)
search_strategy = "hybrid"    # hybrid | bm25 | embedding | regex
allowed_hosts = []            # host names clients use besides loopback

[auth]
# required = true             # default: on whenever listen is not loopback

[governance]
default_effect = "allow"      # allow | deny | require_approval when no policy matches
quarantine_new_tools = false  # hold new write/destructive tools until approved
mask_secrets = true           # mask keys and tokens in tool results

[code_mode]
enabled = true                # execute_code: TypeScript against typed stubs, in a sandbox

# Servers: add them here, with `manifold servers add`, or from another
# client's config with `manifold import --from claude-desktop|cursor|vscode`.
#
# [[servers]]
# name = "time"
# description = "Current time and timezone conversion"
# command = "uvx"
# args = ["mcp-server-time"]
#
# [[servers]]
# name = "tickets"
# description = "Issue tracker"
# url = "https://tickets.example.com/mcp"
# headers = { Authorization = "Bearer ${TICKETS_TOKEN}" }
"#;

/// A server as `manifold servers add` and the console's server form write it.
#[derive(Debug, Default)]
pub struct NewServer<'a> {
    pub name: &'a str,
    pub description: Option<&'a str>,
    /// An HTTP server, with its request headers.
    pub url: Option<&'a str>,
    /// An HTTP server's transport (`auto`, `streamable_http` or `sse`);
    /// written only when given and not `auto`, the default.
    pub transport: Option<&'a str>,
    pub headers: Vec<(String, String)>,
    /// A stdio server, with its arguments and environment.
    pub command: Option<&'a str>,
    pub args: &'a [String],
    pub env: Vec<(String, String)>,
    /// An OpenAPI server (a document file or URL), with where its requests
    /// go; it takes `headers` too.
    pub openapi: Option<&'a str>,
    pub base_url: Option<&'a str>,
    /// Written only when false (true is the default).
    pub autoconnect: bool,
    /// Added through the admin API: written as `origin = "runtime"`, so its
    /// address is checked at every connect.
    pub runtime: bool,
}

impl NewServer<'_> {
    /// The `[[servers]]` table, in the order an operator would write it.
    pub fn table(&self) -> anyhow::Result<Table> {
        let pairs = |items: &[(String, String)]| {
            let mut table = InlineTable::new();
            for (k, v) in items {
                table.insert(k.trim(), v.as_str().into());
            }
            table
        };
        let mut table = Table::new();
        table.insert("name", value(self.name));
        if let Some(description) = self.description.filter(|d| !d.is_empty()) {
            table.insert("description", value(description));
        }
        match (self.url, self.command, self.openapi) {
            (None, None, Some(document)) => {
                table.insert("openapi", value(document));
                if let Some(base_url) = self.base_url {
                    table.insert("base_url", value(base_url));
                }
                if !self.headers.is_empty() {
                    table.insert("headers", value(pairs(&self.headers)));
                }
            }
            (Some(url), None, None) => {
                table.insert("url", value(url));
                if let Some(transport) = self.transport.filter(|t| *t != "auto") {
                    table.insert("transport", value(transport));
                }
                if !self.headers.is_empty() {
                    table.insert("headers", value(pairs(&self.headers)));
                }
            }
            (None, Some(command), None) => {
                table.insert("command", value(command));
                if !self.args.is_empty() {
                    table.insert("args", value(self.args.iter().collect::<Array>()));
                }
                if !self.env.is_empty() {
                    table.insert("env", value(pairs(&self.env)));
                }
            }
            _ => bail!("a server needs exactly one of a url, a command or an openapi document"),
        }
        if self.transport.is_some() && self.url.is_none() {
            bail!("transport belongs to a server with a url");
        }
        if !self.autoconnect {
            table.insert("autoconnect", value(false));
        }
        if self.runtime {
            table.insert("origin", value("runtime"));
        }
        Ok(table)
    }
}

/// A config file opened for editing.
pub struct ConfigFile {
    path: std::path::PathBuf,
    doc: DocumentMut,
}

impl ConfigFile {
    pub fn open(path: &Path) -> anyhow::Result<ConfigFile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let doc: DocumentMut = text
            .parse()
            .with_context(|| format!("{} is not valid TOML", path.display()))?;
        Ok(ConfigFile {
            path: path.to_path_buf(),
            doc,
        })
    }

    /// The file as it would be written.
    pub fn text(&self) -> String {
        self.doc.to_string()
    }

    fn servers_mut(&mut self) -> anyhow::Result<&mut ArrayOfTables> {
        let item = self
            .doc
            .entry("servers")
            .or_insert(Item::ArrayOfTables(ArrayOfTables::new()));
        item.as_array_of_tables_mut()
            .context("`servers` in this file is not an array of [[servers]] tables")
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.doc
            .get("servers")?
            .as_array_of_tables()?
            .iter()
            .position(|t| t.get("name").and_then(Item::as_str) == Some(name))
    }

    pub fn server_names(&self) -> Vec<String> {
        self.doc
            .get("servers")
            .and_then(Item::as_array_of_tables)
            .map(|servers| {
                servers
                    .iter()
                    .filter_map(|t| t.get("name").and_then(Item::as_str).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Appends a `[[servers]]` table; refuses a name that is taken.
    pub fn add_server(&mut self, server: Table) -> anyhow::Result<()> {
        let name = server
            .get("name")
            .and_then(Item::as_str)
            .context("a server needs a name")?
            .to_string();
        if self.position(&name).is_some() {
            bail!(
                "a server named '{name}' is already in {}",
                self.path.display()
            );
        }
        self.servers_mut()?.push(server);
        Ok(())
    }

    pub fn remove_server(&mut self, name: &str) -> anyhow::Result<()> {
        let at = self
            .position(name)
            .with_context(|| format!("no server named '{name}' in {}", self.path.display()))?;
        self.servers_mut()?.remove(at);
        Ok(())
    }

    /// Sets `enabled` (the operator's switch for everyone); `true` removes
    /// the key, since it is the default.
    pub fn set_enabled(&mut self, name: &str, enabled: bool) -> anyhow::Result<()> {
        let at = self
            .position(name)
            .with_context(|| format!("no server named '{name}' in {}", self.path.display()))?;
        let table = self
            .servers_mut()?
            .get_mut(at)
            .expect("the position was just found");
        if enabled {
            table.remove("enabled");
        } else {
            table.insert("enabled", value(false));
        }
        Ok(())
    }

    /// Checks that the edited text loads as a config, then writes it
    /// (through a temporary file and a rename, so a reader never sees half).
    pub fn save(&self) -> anyhow::Result<()> {
        let text = self.text();
        Config::parse(
            &text,
            self.path.parent().unwrap_or(Path::new(".")).to_path_buf(),
        )
        .context("the edited config would not load; nothing was written")?;
        let tmp = self.path.with_extension("toml.manifold-tmp");
        std::fs::write(&tmp, &text).with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.path)
            .with_context(|| format!("cannot replace {}", self.path.display()))?;
        Ok(())
    }
}

/// Writes the starter config to `path`; refuses to overwrite a file.
pub fn init(path: &Path) -> anyhow::Result<()> {
    if path.exists() {
        bail!("{} exists; not overwriting it", path.display());
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(path, STARTER).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_starter_loads_as_it_is() {
        let config = Config::parse(STARTER, std::path::PathBuf::from("/tmp")).unwrap();
        assert!(config.servers.is_empty());
        assert!(config.code_mode.enabled);
    }

    #[test]
    fn edits_keep_comments_and_order_and_refuse_what_would_not_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manifold.toml");
        std::fs::write(
            &path,
            "# my gateway\n[gateway]\nmode = \"direct\" # small catalog\n\n\
             # the clock\n[[servers]]\nname = \"time\"\ncommand = \"mcp-server-time\"\n",
        )
        .unwrap();
        let mut file = ConfigFile::open(&path).unwrap();
        let mut server = Table::new();
        server.insert("name", value("notes"));
        server.insert("url", value("http://127.0.0.1:9/mcp"));
        file.add_server(server.clone()).unwrap();
        assert!(file.add_server(server).is_err(), "a taken name");
        file.set_enabled("time", false).unwrap();
        file.save().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# my gateway\n"), "{text}");
        assert!(text.contains("mode = \"direct\" # small catalog"), "{text}");
        assert!(text.contains("# the clock"), "{text}");
        assert!(text.find("name = \"time\"") < text.find("name = \"notes\""));
        let config = Config::load(&path).unwrap();
        assert_eq!(config.servers.len(), 2);
        assert!(!config.servers[0].enabled);

        let mut file = ConfigFile::open(&path).unwrap();
        file.set_enabled("time", true).unwrap();
        file.remove_server("notes").unwrap();
        assert!(file.remove_server("notes").is_err());
        file.save().unwrap();
        let config = Config::load(&path).unwrap();
        let names: Vec<&str> = config.servers.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["time"]);
        assert!(config.servers[0].enabled);

        // A server both stdio and HTTP does not load: nothing is written.
        let before = std::fs::read_to_string(&path).unwrap();
        let mut file = ConfigFile::open(&path).unwrap();
        let mut bad = Table::new();
        bad.insert("name", value("bad"));
        bad.insert("command", value("x"));
        bad.insert("url", value("http://127.0.0.1:9/mcp"));
        file.add_server(bad).unwrap();
        assert!(file.save().is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), before);
    }

    #[test]
    fn an_openapi_server_is_written_with_its_base_url_and_headers() {
        let table = NewServer {
            name: "shop",
            openapi: Some("specs/shop.yaml"),
            base_url: Some("https://shop.internal/v2"),
            headers: vec![("X-Api-Key".into(), "${SHOP_KEY}".into())],
            autoconnect: true,
            ..NewServer::default()
        }
        .table()
        .unwrap();
        let text = table.to_string();
        assert_eq!(
            text,
            "name = \"shop\"\nopenapi = \"specs/shop.yaml\"\nbase_url = \"https://shop.internal/v2\"\nheaders = { X-Api-Key = \"${SHOP_KEY}\" }\n"
        );
        let both = NewServer {
            name: "x",
            openapi: Some("a.yaml"),
            url: Some("http://127.0.0.1:9/mcp"),
            ..NewServer::default()
        };
        assert!(both.table().is_err());
    }

    #[test]
    fn an_http_server_is_written_with_its_transport_unless_auto() {
        let with = |transport: Option<&str>, url: Option<&str>| {
            NewServer {
                name: "old",
                url,
                transport,
                command: url.is_none().then_some("srv"),
                autoconnect: true,
                ..NewServer::default()
            }
            .table()
            .map(|t| t.to_string())
        };
        let url = Some("https://example.com/sse");
        assert_eq!(
            with(Some("sse"), url).unwrap(),
            "name = \"old\"\nurl = \"https://example.com/sse\"\ntransport = \"sse\"\n"
        );
        assert!(!with(Some("auto"), url).unwrap().contains("transport"));
        assert!(!with(None, url).unwrap().contains("transport"));
        let error = with(Some("sse"), None).unwrap_err().to_string();
        assert!(
            error.contains("transport belongs to a server with a url"),
            "{error}"
        );
    }

    #[test]
    fn init_writes_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/manifold.toml");
        init(&path).unwrap();
        assert!(init(&path).is_err());
        Config::load(&path).unwrap();
    }
}
