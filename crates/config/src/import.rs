//! `manifold import`: servers from another MCP client's config, as
//! `[[servers]]` tables. Claude Desktop and Cursor keep `mcpServers`; VS Code
//! keeps `servers` beside `inputs` (values the editor prompts for). Literal
//! secrets become `${VAR}` references and the variables to set are listed;
//! a value that already names a variable keeps naming it (in the gateway's
//! `${VAR}` spelling), and other plain values stay as written. Legacy SSE
//! servers become `transport = "sse"` entries. What cannot be converted
//! (unknown shapes) is reported with the reason, never dropped silently.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};
use serde_json::{Map, Value};
use toml_edit::{Array, InlineTable, Table, value};

/// Where each client keeps its config, most specific first.
pub fn known_locations(client: &str, home: &Path, cwd: &Path) -> anyhow::Result<Vec<PathBuf>> {
    Ok(match client {
        "claude-desktop" | "claude" => vec![
            home.join(".config/Claude/claude_desktop_config.json"),
            home.join("Library/Application Support/Claude/claude_desktop_config.json"),
            home.join("AppData/Roaming/Claude/claude_desktop_config.json"),
        ],
        "cursor" => vec![cwd.join(".cursor/mcp.json"), home.join(".cursor/mcp.json")],
        "vscode" | "code" => vec![cwd.join(".vscode/mcp.json")],
        other => bail!(
            "unknown client '{other}' (expected claude-desktop, cursor, vscode, or a file path)"
        ),
    })
}

/// One imported server.
#[derive(Debug)]
pub struct Imported {
    pub name: String,
    pub table: Table,
}

/// What an import found.
#[derive(Debug, Default)]
pub struct Import {
    pub servers: Vec<Imported>,
    /// Variables the converted servers read: (name, where it came from).
    pub variables: BTreeMap<String, String>,
    /// Entries not converted, with the reason.
    pub skipped: Vec<(String, String)>,
    /// Entries converted with a change the operator should know about.
    pub notes: Vec<(String, String)>,
}

impl Import {
    /// The servers as TOML, ready to paste into a config.
    pub fn toml(&self) -> String {
        let mut doc = toml_edit::DocumentMut::new();
        let mut servers = toml_edit::ArrayOfTables::new();
        for server in &self.servers {
            servers.push(server.table.clone());
        }
        doc.insert("servers", toml_edit::Item::ArrayOfTables(servers));
        doc.to_string()
    }
}

/// Whether a literal value is a credential by its form alone (a key or token
/// pattern), whatever its name says. The CLI passes the broker's result
/// masking patterns, so one list of secret shapes serves both.
pub type SecretShape<'a> = &'a dyn Fn(&str) -> bool;

/// Reads a client config file (JSON, comments allowed as VS Code writes them).
pub fn import_file(path: &Path, secret_shape: SecretShape) -> anyhow::Result<Import> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let json: Value = serde_json::from_str(&strip_json_comments(&text))
        .with_context(|| format!("{} is not JSON", path.display()))?;
    let workspace = path
        .parent()
        .and_then(|dir| match dir.file_name().and_then(|n| n.to_str()) {
            Some(".vscode") | Some(".cursor") => dir.parent(),
            _ => Some(dir),
        })
        .unwrap_or(Path::new("."));
    import_json(&json, workspace, secret_shape)
}

/// Converts a parsed client config; `workspace` stands for VS Code's
/// `${workspaceFolder}`.
pub fn import_json(
    json: &Value,
    workspace: &Path,
    secret_shape: SecretShape,
) -> anyhow::Result<Import> {
    let servers = json
        .get("mcpServers")
        .or_else(|| json.get("servers"))
        .and_then(Value::as_object)
        .context("no `mcpServers` (Claude Desktop, Cursor) or `servers` (VS Code) object")?;
    let inputs: BTreeMap<String, String> = json
        .get("inputs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|input| {
            let id = input.get("id")?.as_str()?.to_string();
            let about = input
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("a VS Code input")
                .to_string();
            Some((id, about))
        })
        .collect();
    let mut out = Import::default();
    for (original, entry) in servers {
        let Some(entry) = entry.as_object() else {
            out.skipped
                .push((original.clone(), "the entry is not an object".into()));
            continue;
        };
        if entry.get("disabled").and_then(Value::as_bool) == Some(true) {
            out.notes.push((
                original.clone(),
                "disabled in the client; imported with enabled = false".into(),
            ));
        }
        match convert(original, entry, &inputs, workspace, secret_shape, &mut out) {
            Ok(server) => out.servers.push(server),
            Err(reason) => out.skipped.push((original.clone(), reason)),
        }
    }
    Ok(out)
}

fn convert(
    original: &str,
    entry: &Map<String, Value>,
    inputs: &BTreeMap<String, String>,
    workspace: &Path,
    secret_shape: SecretShape,
    out: &mut Import,
) -> Result<Imported, String> {
    let name = manifold_catalog::server_name(original);
    if name != original {
        out.notes.push((
            original.to_string(),
            format!("renamed to '{name}' (server names are letters, digits, '-' and single '_')"),
        ));
    }
    let kind = entry.get("type").and_then(Value::as_str);
    let url = entry
        .get("url")
        .or_else(|| entry.get("serverUrl"))
        .and_then(Value::as_str);
    let command = entry.get("command").and_then(Value::as_str);
    let mut table = Table::new();
    table.insert("name", value(&name));
    let description = entry
        .get("description")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| format!("Imported from '{original}'"));
    table.insert("description", value(description));
    let text = |raw: &str, var_hint: &str, secret: bool, out: &mut Import| -> String {
        resolve(raw, &name, var_hint, secret, inputs, workspace, out)
    };
    // The legacy HTTP+SSE transport: said so, or a bare URL at `/sse`.
    let legacy_sse = kind == Some("sse")
        || (kind.is_none() && url.is_some_and(|u| u.trim_end_matches('/').ends_with("/sse")));
    match (kind, command, url) {
        (Some("stdio") | None, Some(command), None) => {
            table.insert("command", value(text(command, "COMMAND", false, out)));
            let args: Array = entry
                .get("args")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(|a| text(a, "ARG", false, out))
                .collect();
            if !args.is_empty() {
                table.insert("args", value(args));
            }
            let env = string_map(entry.get("env"));
            if !env.is_empty() {
                let mut inline = InlineTable::new();
                for (key, raw) in env {
                    let secret = looks_secret(&key, &raw, secret_shape);
                    inline.insert(&key, text(&raw, &key, secret, out).into());
                }
                table.insert("env", value(inline));
            }
            if let Some(cwd) = entry.get("cwd").and_then(Value::as_str) {
                table.insert("cwd", value(text(cwd, "CWD", false, out)));
            }
            if entry.contains_key("envFile") {
                out.notes.push((original.to_string(), "envFile is not read: set its variables in the gateway's environment and name them in inherit_env".into()));
            }
        }
        (
            Some("http") | Some("streamable-http") | Some("streamableHttp") | Some("sse") | None,
            None,
            Some(url),
        ) => {
            table.insert("url", value(text(url, "URL", false, out)));
            if legacy_sse {
                table.insert("transport", value("sse"));
            }
            let headers = string_map(entry.get("headers"));
            if !headers.is_empty() {
                let mut inline = InlineTable::new();
                for (key, raw) in headers {
                    let secret = looks_secret(&key, &raw, secret_shape)
                        || key.eq_ignore_ascii_case("authorization");
                    inline.insert(&key, text(&raw, &key, secret, out).into());
                }
                table.insert("headers", value(inline));
            }
        }
        (Some(other), _, _) if !matches!(other, "stdio" | "http") => {
            return Err(format!("transport type '{other}' is not supported"));
        }
        (_, Some(_), Some(_)) => return Err("has both command and url".into()),
        _ => return Err("needs a command (stdio) or a url (HTTP)".into()),
    }
    if entry.get("disabled").and_then(Value::as_bool) == Some(true) {
        table.insert("enabled", value(false));
    }
    Ok(Imported { name, table })
}

fn string_map(value: Option<&Value>) -> Vec<(String, String)> {
    value
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect()
}

/// Whether an env or header value is a secret to keep out of the file: a
/// value of a secret's shape, or one under a secret's name unless it is
/// plainly not one (a flag, a number, a path, a URL without credentials).
fn looks_secret(key: &str, raw: &str, secret_shape: SecretShape) -> bool {
    let key = key.to_ascii_lowercase().replace('-', "_");
    let named = [
        "token",
        "secret",
        "password",
        "passwd",
        "api_key",
        "apikey",
        "auth",
        "credential",
        "private",
        "_pat",
        "access_key",
    ]
    .iter()
    .any(|part| key.contains(part));
    (named && !plainly_not_secret(raw)) || secret_shape(raw)
}

fn plainly_not_secret(raw: &str) -> bool {
    let raw = raw.trim();
    let flag = [
        "", "true", "false", "yes", "no", "on", "off", "none", "0", "1",
    ]
    .contains(&raw.to_ascii_lowercase().as_str());
    let number = raw.parse::<f64>().is_ok();
    let path = ["/", "./", "../", "~/"].iter().any(|p| raw.starts_with(p));
    let url = (raw.starts_with("https://") || raw.starts_with("http://")) && !raw.contains('@');
    flag || number || path || url
}

/// A value with client variables (`${input:x}`, `${env:X}`,
/// `${workspaceFolder}`) turned into the gateway's `${VAR}` form, and a
/// literal secret replaced by a variable named after the server and key.
fn resolve(
    raw: &str,
    server: &str,
    hint: &str,
    secret: bool,
    inputs: &BTreeMap<String, String>,
    workspace: &Path,
    out: &mut Import,
) -> String {
    let var_name = |part: &str| -> String {
        let mut s: String = format!("{server}_{part}")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                }
            })
            .collect();
        while s.contains("__") {
            s = s.replace("__", "_");
        }
        s
    };
    let (text, referenced) = references(raw, server, inputs, workspace, &var_name, out);
    // A value that names variables is the user's own reference: kept.
    if referenced || !secret {
        return text;
    }
    let var = if hint
        .chars()
        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    {
        hint.to_string()
    } else {
        var_name(hint)
    };
    out.variables.insert(
        var.clone(),
        format!("{server}: the value of {hint} (was written in the file)"),
    );
    // Keep a scheme word such as `Bearer ` in front of the variable.
    match raw.split_once(' ') {
        Some((scheme, _)) if hint.eq_ignore_ascii_case("authorization") => {
            format!("{scheme} ${{{var}}}")
        }
        _ => format!("${{{var}}}"),
    }
}

/// `raw` with every variable reference in the gateway's `${VAR}` form, and
/// whether it had any: `${VAR}`, `$VAR` (a word of its own), `${env:VAR}`
/// and `{env:VAR}` name the same variable; VS Code's `${input:id}` becomes a
/// variable named after the server and input. `${workspaceFolder}` is the
/// workspace's path, not a variable.
fn references(
    raw: &str,
    server: &str,
    inputs: &BTreeMap<String, String>,
    workspace: &Path,
    var_name: &dyn Fn(&str) -> String,
    out: &mut Import,
) -> (String, bool) {
    let raw = raw.replace("${workspaceFolder}", &workspace.display().to_string());
    let mut text = String::with_capacity(raw.len());
    let mut referenced = false;
    let mut rest = raw.as_str();
    let mut at_word_start = true;
    while let Some(c) = rest.chars().next() {
        let reference = if rest.starts_with("${") || rest.starts_with("{env:") {
            let open = if rest.starts_with('$') { 2 } else { 1 };
            rest.find('}').map(|end| (&rest[open..end], end + 1))
        } else if c == '$' && at_word_start {
            let len = rest[1..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len() - 1);
            let name = &rest[1..1 + len];
            let word_ends = rest[1 + len..]
                .chars()
                .next()
                .is_none_or(char::is_whitespace);
            let shaped = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_uppercase() || c == '_')
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            (shaped && word_ends).then_some((name, 1 + len))
        } else {
            None
        };
        let Some((inner, taken)) = reference else {
            text.push(c);
            at_word_start = c.is_whitespace();
            rest = &rest[c.len_utf8()..];
            continue;
        };
        let var = if let Some(id) = inner.strip_prefix("input:") {
            let about = inputs
                .get(id)
                .cloned()
                .unwrap_or_else(|| format!("input '{id}'"));
            let var = var_name(id);
            out.variables
                .insert(var.clone(), format!("{server}: {about}"));
            var
        } else {
            let var = inner.strip_prefix("env:").unwrap_or(inner).to_string();
            out.variables
                .insert(var.clone(), format!("{server}: read from the environment"));
            var
        };
        text.push_str(&format!("${{{var}}}"));
        referenced = true;
        at_word_start = false;
        rest = &rest[taken..];
    }
    (text, referenced)
}

/// VS Code's JSON allows `//` and `/* */` comments and trailing commas.
fn strip_json_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            if c == '\\' {
                if let Some(next) = chars.next() {
                    out.push(next);
                }
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match (c, chars.peek()) {
            ('"', _) => {
                in_string = true;
                out.push(c);
            }
            ('/', Some('/')) => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                chars.next();
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
            }
            _ => out.push(c),
        }
    }
    // Trailing commas before a closing bracket.
    let mut cleaned = String::with_capacity(out.len());
    let bytes: Vec<char> = out.chars().collect();
    let mut i = 0;
    let mut in_string = false;
    while i < bytes.len() {
        let c = bytes[i];
        if in_string {
            cleaned.push(c);
            if c == '\\' && i + 1 < bytes.len() {
                cleaned.push(bytes[i + 1]);
                i += 2;
                continue;
            }
            if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            cleaned.push(c);
        } else if c == ',' {
            let next = bytes[i + 1..].iter().find(|c| !c.is_whitespace());
            if !matches!(next, Some('}') | Some(']')) {
                cleaned.push(c);
            }
        } else {
            cleaned.push(c);
        }
        i += 1;
    }
    cleaned
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn claude_desktop_stdio_and_http_with_secrets() {
        let json = json!({"mcpServers": {
            "github": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-github"],
                       "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_0123456789abcdefghijABCDEFGHIJ012345", "TZ": "UTC"}},
            "linear": {"type": "http", "url": "https://mcp.linear.app/mcp",
                       "headers": {"Authorization": "Bearer lin_api_abc123"}},
            "old": {"type": "sse", "url": "https://example.com/sse"},
            "weird name!": {"command": "x"}
        }});
        let import = import_json(&json, Path::new("/w"), &|_| false).unwrap();
        let toml = import.toml();
        assert!(
            !toml.contains("ghp_") && !toml.contains("lin_api_abc123"),
            "{toml}"
        );
        assert!(
            toml.contains("GITHUB_PERSONAL_ACCESS_TOKEN = \"${GITHUB_PERSONAL_ACCESS_TOKEN}\""),
            "{toml}"
        );
        assert!(toml.contains("TZ = \"UTC\""), "non-secrets stay: {toml}");
        assert!(
            toml.contains("Authorization = \"Bearer ${LINEAR_AUTHORIZATION}\""),
            "{toml}"
        );
        assert!(
            import
                .variables
                .contains_key("GITHUB_PERSONAL_ACCESS_TOKEN")
        );
        assert!(import.variables.contains_key("LINEAR_AUTHORIZATION"));
        assert!(import.skipped.is_empty(), "{:?}", import.skipped);
        assert!(
            toml.contains("url = \"https://example.com/sse\"\ntransport = \"sse\""),
            "a legacy SSE server is written: {toml}"
        );
        assert!(
            import
                .servers
                .iter()
                .any(|s| s.name == "weird-name" || s.name == "weird_name")
        );
        let config = crate::Config::parse(&toml, PathBuf::from("/tmp")).unwrap();
        assert_eq!(config.servers.len(), 4);
        let old = config.servers.iter().find(|s| s.name == "old").unwrap();
        assert_eq!(old.transport, Some(manifold_upstream::HttpTransport::Sse));
    }

    #[test]
    fn what_the_user_wrote_is_kept() {
        let json = json!({"mcpServers": {
            "hosted": {"url": "https://hosted.example/sse",
                       "headers": {"Authorization": "Bearer ${HOSTED_TOKEN}", "X-Api-Key": "$HOSTED_KEY"}},
            "local": {"command": "/opt/bin/server", "args": ["--root", "/srv/data", "--verbose"],
                      "env": {"GITHUB_TOKEN": "{env:GH_TOKEN}", "AUTH_MODE": "off",
                              "TOKEN_FILE": "/etc/token", "API_KEY": "${env:LOCAL_KEY}",
                              "SECRET_PHRASE": "pa$word with $lower", "PASSWORD": "hunter2hunter2"}}
        }});
        let import = import_json(&json, Path::new("/w"), &|_| false).unwrap();
        let toml = import.toml();
        for kept in [
            "Authorization = \"Bearer ${HOSTED_TOKEN}\"",
            "X-Api-Key = \"${HOSTED_KEY}\"",
            "GITHUB_TOKEN = \"${GH_TOKEN}\"",
            "API_KEY = \"${LOCAL_KEY}\"",
            "AUTH_MODE = \"off\"",
            "TOKEN_FILE = \"/etc/token\"",
            "args = [\"--root\", \"/srv/data\", \"--verbose\"]",
            "transport = \"sse\"",
        ] {
            assert!(toml.contains(kept), "{kept} in {toml}");
        }
        // Literal secrets, and a `$` that is no reference, are not kept.
        assert!(
            !toml.contains("hunter2") && !toml.contains("pa$word"),
            "{toml}"
        );
        assert!(toml.contains("PASSWORD = \"${PASSWORD}\""), "{toml}");
        for var in [
            "HOSTED_TOKEN",
            "HOSTED_KEY",
            "GH_TOKEN",
            "LOCAL_KEY",
            "PASSWORD",
        ] {
            assert!(
                import.variables.contains_key(var),
                "{var}: {:?}",
                import.variables
            );
        }
    }

    #[test]
    fn vscode_inputs_env_and_workspace_become_variables() {
        let text = r#"{
          // VS Code allows comments
          "inputs": [{"type": "promptString", "id": "api-key", "description": "Tracker API key", "password": true}],
          "servers": {
            "tracker": {"type": "http", "url": "https://tracker.example/mcp",
                        "headers": {"X-Api-Key": "${input:api-key}"}},
            "files": {"type": "stdio", "command": "node", "args": ["${workspaceFolder}/server.js"],
                      "env": {"HOME_DIR": "${env:HOME}"}},
          }
        }"#;
        let json: Value = serde_json::from_str(&strip_json_comments(text)).unwrap();
        let import = import_json(&json, Path::new("/work/repo"), &|_| false).unwrap();
        let toml = import.toml();
        assert!(
            toml.contains("X-Api-Key = \"${TRACKER_API_KEY}\""),
            "{toml}"
        );
        assert!(toml.contains("\"/work/repo/server.js\""), "{toml}");
        assert!(toml.contains("HOME_DIR = \"${HOME}\""), "{toml}");
        assert_eq!(
            import.variables["TRACKER_API_KEY"],
            "tracker: Tracker API key"
        );
        assert!(import.skipped.is_empty());
    }
}
