//! `manifold import`: servers from another MCP client's config, as
//! `[[servers]]` tables. Claude Desktop and Cursor keep `mcpServers`; VS Code
//! keeps `servers` beside `inputs` (values the editor prompts for). Literal
//! secrets become `${VAR}` references and the variables to set are listed;
//! what cannot be converted (legacy SSE, unknown shapes) is reported with
//! the reason, never dropped silently.

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
    match (kind, command, url) {
        (Some("sse"), _, _) => {
            return Err("legacy SSE transport: Manifold connects to Streamable HTTP servers only; if this server also serves Streamable HTTP (often at /mcp), add that URL".into());
        }
        (_, None, Some(url)) if kind.is_none() && url.trim_end_matches('/').ends_with("/sse") => {
            return Err(format!(
                "{url} looks like a legacy SSE endpoint: Manifold connects to Streamable HTTP servers only; add the server's Streamable HTTP URL (often /mcp) instead"
            ));
        }
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
            Some("http") | Some("streamable-http") | Some("streamableHttp") | None,
            None,
            Some(url),
        ) => {
            table.insert("url", value(text(url, "URL", false, out)));
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
        _ => return Err("needs a command (stdio) or a url (Streamable HTTP)".into()),
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

/// Whether an env or header value is a secret to keep out of the file.
fn looks_secret(key: &str, raw: &str, secret_shape: SecretShape) -> bool {
    if raw.contains("${") {
        return false;
    }
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
    named || secret_shape(raw)
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
    if secret {
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
        return match raw.split_once(' ') {
            Some((scheme, _)) if hint.eq_ignore_ascii_case("authorization") => {
                format!("{scheme} ${{{var}}}")
            }
            _ => format!("${{{var}}}"),
        };
    }
    let mut text = raw.replace("${workspaceFolder}", &workspace.display().to_string());
    while let Some(start) = text.find("${input:") {
        let Some(len) = text[start..].find('}') else {
            break;
        };
        let id = &text[start + 8..start + len];
        let var = var_name(id);
        let about = inputs
            .get(id)
            .cloned()
            .unwrap_or_else(|| format!("input '{id}'"));
        out.variables
            .insert(var.clone(), format!("{server}: {about}"));
        text.replace_range(start..start + len + 1, &format!("${{{var}}}"));
    }
    while let Some(start) = text.find("${env:") {
        let Some(len) = text[start..].find('}') else {
            break;
        };
        let var = text[start + 6..start + len].to_string();
        out.variables
            .insert(var.clone(), format!("{server}: read from the environment"));
        text.replace_range(start..start + len + 1, &format!("${{{var}}}"));
    }
    text
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
        assert_eq!(import.skipped.len(), 1);
        assert!(
            import.skipped[0].1.contains("legacy SSE"),
            "{:?}",
            import.skipped
        );
        assert!(
            import
                .servers
                .iter()
                .any(|s| s.name == "weird-name" || s.name == "weird_name")
        );
        let config = crate::Config::parse(&toml, PathBuf::from("/tmp")).unwrap();
        assert_eq!(config.servers.len(), 3);
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
