//! TypeScript declarations from tool definitions.
//!
//! Each server becomes `declare namespace <server>`; each tool a function
//! `<tool>(input: <Tool>Input): Promise<<Tool>Output>`, so server `time` and
//! tool `get_current_time` are called as `time.get_current_time({...})`.
//! Names that are not identifiers are rewritten (`-` and other characters
//! become `_`, a leading digit or a reserved word gets an underscore) and
//! made unique within their scope. The output type comes from
//! `outputSchema` (the `structuredContent`), else the broad `ToolResult`.
//!
//! JSON Schema is wider than TypeScript; the mapping keeps what a caller
//! needs and widens the rest to `unknown`, never to something narrower than
//! the schema allows.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{Map, Value};

/// One tool as the generator needs it.
#[derive(Debug, Clone)]
pub struct StubTool<'a> {
    pub server: &'a str,
    pub name: &'a str,
    pub description: &'a str,
    pub input_schema: &'a Value,
    pub output_schema: Option<&'a Value>,
}

/// Schemas nested deeper than this become `unknown`.
const MAX_DEPTH: usize = 12;

const RESERVED: &[&str] = &[
    "break",
    "case",
    "catch",
    "class",
    "const",
    "continue",
    "debugger",
    "default",
    "delete",
    "do",
    "else",
    "enum",
    "export",
    "extends",
    "false",
    "finally",
    "for",
    "function",
    "if",
    "import",
    "in",
    "instanceof",
    "new",
    "null",
    "return",
    "super",
    "switch",
    "this",
    "throw",
    "true",
    "try",
    "typeof",
    "var",
    "void",
    "while",
    "with",
    "as",
    "implements",
    "interface",
    "let",
    "package",
    "private",
    "protected",
    "public",
    "static",
    "yield",
    "any",
    "boolean",
    "number",
    "string",
    "symbol",
    "type",
    "from",
    "of",
    "namespace",
    "declare",
    "module",
    "await",
    "async",
];

/// A TypeScript identifier for `name`: other characters become `_`, a
/// leading digit or a reserved word gets `_` in front.
pub fn identifier(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '$' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty()
        || out.starts_with(|c: char| c.is_ascii_digit())
        || RESERVED.contains(&out.as_str())
    {
        out.insert(0, '_');
    }
    out
}

/// Hands out identifiers unique within one scope.
#[derive(Default)]
struct Scope(HashSet<String>);

impl Scope {
    fn claim(&mut self, name: &str) -> String {
        let base = identifier(name);
        let mut candidate = base.clone();
        let mut n = 2;
        while !self.0.insert(candidate.clone()) {
            candidate = format!("{base}_{n}");
            n += 1;
        }
        candidate
    }
}

/// The shared preamble: the result type, the error stubs throw, and the
/// untyped fallback.
pub const PRELUDE: &str = "\
/** What a tool returns when it declares no outputSchema. */
interface ToolResult {
  content: Array<{ type: string; text?: string; [key: string]: unknown }>;
  structuredContent?: unknown;
  isError?: boolean;
}
/** Thrown by a stub when the tool answers with isError, or the gateway refuses the call. */
declare class ToolError extends Error {
  server: string;
  tool: string;
  content: unknown[];
}
/** Calls any tool by its qualified name (server__tool). */
declare function callTool(name: string, args?: Record<string, unknown>): Promise<ToolResult>;
";

/// Script names for a whole catalog: one namespace per server and one
/// function per tool, unique and stable for a given set of tools.
///
/// Computed over every tool, not over what one listing shows, so the name a
/// model saw in a search result is the name the sandbox binds. Names that
/// are already identifiers keep them; rewritten names yield on collision
/// (`get_time` stays, `get-time` becomes `get_time_2`).
#[derive(Debug, Clone, Default)]
pub struct Bindings {
    namespaces: HashMap<String, String>,
    functions: HashMap<(String, String), String>,
}

/// Names the prelude and the sandbox define globally.
pub const GLOBALS: &[&str] = &[
    "ToolResult",
    "ToolError",
    "callTool",
    "console",
    "globalThis",
];

impl Bindings {
    /// `tools` are `(server, tool)` pairs.
    pub fn new<'a>(tools: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut by_server: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (server, tool) in tools {
            by_server.entry(server).or_default().push(tool);
        }
        let mut namespaces = Scope::default();
        for name in GLOBALS {
            namespaces.claim(name);
        }
        let mut out = Bindings::default();
        let servers: Vec<&str> = by_server.keys().copied().collect();
        for server in claim_order(&servers) {
            let namespace = namespaces.claim(server);
            out.namespaces.insert(server.to_string(), namespace);
        }
        for (server, mut tools) in by_server {
            tools.sort_unstable();
            tools.dedup();
            let mut names = Scope::default();
            for tool in claim_order(&tools) {
                let function = names.claim(tool);
                out.functions
                    .insert((server.to_string(), tool.to_string()), function);
            }
        }
        out
    }

    pub fn namespace(&self, server: &str) -> Option<&str> {
        self.namespaces.get(server).map(String::as_str)
    }

    pub fn function(&self, server: &str, tool: &str) -> Option<&str> {
        self.functions
            .get(&(server.to_string(), tool.to_string()))
            .map(String::as_str)
    }
}

/// Names that need no rewriting first, then the rest, each in sorted order.
fn claim_order<'a>(names: &[&'a str]) -> Vec<&'a str> {
    let mut sorted = names.to_vec();
    sorted.sort_unstable();
    let (exact, rewritten): (Vec<&str>, Vec<&str>) =
        sorted.into_iter().partition(|n| identifier(n) == *n);
    exact.into_iter().chain(rewritten).collect()
}

/// Declarations for `tools`, grouped by server in first-seen order,
/// preceded by [`PRELUDE`], named by bindings computed over `tools` alone.
pub fn declarations(tools: &[StubTool<'_>]) -> String {
    let bindings = Bindings::new(tools.iter().map(|t| (t.server, t.name)));
    declarations_with(tools, &bindings)
}

/// Declarations for `tools` named by `bindings`, which should cover the
/// whole catalog the sandbox binds (tools missing from it get names of
/// their own).
pub fn declarations_with(tools: &[StubTool<'_>], bindings: &Bindings) -> String {
    let mut servers: Vec<(&str, Vec<&StubTool<'_>>)> = Vec::new();
    for tool in tools {
        match servers.iter_mut().find(|(s, _)| *s == tool.server) {
            Some((_, list)) => list.push(tool),
            None => servers.push((tool.server, vec![tool])),
        }
    }
    let mut out = String::from(PRELUDE);
    for (server, tools) in servers {
        let namespace = bindings
            .namespace(server)
            .map_or_else(|| identifier(server), str::to_string);
        out.push_str(&format!("\ndeclare namespace {namespace} {{\n"));
        let mut names = Scope::default();
        let functions: Vec<String> = tools
            .iter()
            .map(|t| {
                bindings
                    .function(t.server, t.name)
                    .map_or_else(|| identifier(t.name), str::to_string)
            })
            .collect();
        for function in &functions {
            names.0.insert(function.clone());
        }
        for (tool, function) in tools.into_iter().zip(functions) {
            out.push_str(&tool_declaration(tool, &function, &mut names));
        }
        out.push_str("}\n");
    }
    out
}

fn tool_declaration(tool: &StubTool<'_>, function: &str, names: &mut Scope) -> String {
    let type_base = pascal(function);
    let input_name = names.claim(&format!("{type_base}Input"));
    let mut out = String::new();
    let mut defs = Defs::new(&type_base, names);
    let input = ts_type(tool.input_schema, tool.input_schema, &mut defs, 0);
    let output = match tool.output_schema {
        Some(schema) => {
            let output_name = defs.names.claim(&format!("{type_base}Output"));
            let ty = ts_type(schema, schema, &mut defs, 0);
            out.push_str(&format!("  type {output_name} = {ty};\n"));
            output_name
        }
        None => "ToolResult".to_string(),
    };
    for (name, ty) in std::mem::take(&mut defs.emitted) {
        out.push_str(&format!("  type {name} = {ty};\n"));
    }
    out.push_str(&format!("  type {input_name} = {input};\n"));
    out.push_str(&doc(tool.description, "  "));
    out.push_str(&format!(
        "  function {function}(input: {input_name}): Promise<{output}>;\n"
    ));
    out
}

/// `get_current_time` → `GetCurrentTime`.
fn pascal(name: &str) -> String {
    let mut out = String::new();
    let mut upper = true;
    for c in name.chars() {
        if c == '_' || c == '$' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, 'T');
    }
    out
}

/// Named definitions (`$defs`) of one tool, emitted once each as type
/// aliases; a reference to one in progress is what makes recursion work.
struct Defs<'s> {
    prefix: String,
    names: &'s mut Scope,
    assigned: BTreeMap<String, String>,
    emitted: Vec<(String, String)>,
}

impl<'s> Defs<'s> {
    fn new(prefix: &str, names: &'s mut Scope) -> Self {
        Defs {
            prefix: prefix.to_string(),
            names,
            assigned: BTreeMap::new(),
            emitted: Vec::new(),
        }
    }
}

fn doc(text: &str, indent: &str) -> String {
    let text = text.trim();
    if text.is_empty() {
        return String::new();
    }
    let safe = text.replace("*/", "*\\/");
    let mut out = format!("{indent}/**\n");
    for line in safe.lines() {
        out.push_str(&format!("{indent} * {}\n", line.trim_end()));
    }
    out.push_str(&format!("{indent} */\n"));
    out
}

fn literal(value: &Value) -> String {
    match value {
        Value::String(_) | Value::Number(_) | Value::Bool(_) | Value::Null => value.to_string(),
        _ => "unknown".to_string(),
    }
}

/// A property key: bare if it is an identifier, quoted otherwise.
fn key(name: &str) -> String {
    let bare = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
    if bare {
        name.to_string()
    } else {
        Value::String(name.to_string()).to_string()
    }
}

/// Resolves a local `$ref` (`#/$defs/X` or `#/definitions/X`) to a type name.
fn reference(target: &str, root: &Value, defs: &mut Defs<'_>, depth: usize) -> String {
    let Some(path) = target.strip_prefix("#/") else {
        return "unknown".to_string();
    };
    if target == "#" {
        return "unknown".to_string();
    }
    if let Some(name) = defs.assigned.get(target) {
        return name.clone();
    }
    let mut node = root;
    for part in path.split('/') {
        let part = part.replace("~1", "/").replace("~0", "~");
        match node.get(&part) {
            Some(next) => node = next,
            None => return "unknown".to_string(),
        }
    }
    let last = path.rsplit('/').next().unwrap_or("Def");
    let name = defs
        .names
        .claim(&format!("{}{}", defs.prefix, pascal(&identifier(last))));
    defs.assigned.insert(target.to_string(), name.clone());
    let ty = ts_type(node, root, defs, depth + 1);
    defs.emitted.push((name.clone(), ty));
    name
}

fn ts_type(schema: &Value, root: &Value, defs: &mut Defs<'_>, depth: usize) -> String {
    if depth > MAX_DEPTH {
        return "unknown".to_string();
    }
    let object = match schema {
        Value::Bool(true) => return "unknown".to_string(),
        Value::Bool(false) => return "never".to_string(),
        Value::Object(object) => object,
        _ => return "unknown".to_string(),
    };
    let mut ty = base_type(object, root, defs, depth);
    if object.get("nullable") == Some(&Value::Bool(true)) && ty != "unknown" {
        ty = format!("{ty} | null");
    }
    ty
}

fn base_type(
    object: &Map<String, Value>,
    root: &Value,
    defs: &mut Defs<'_>,
    depth: usize,
) -> String {
    if let Some(Value::String(target)) = object.get("$ref") {
        return reference(target, root, defs, depth);
    }
    if let Some(value) = object.get("const") {
        return literal(value);
    }
    if let Some(Value::Array(values)) = object.get("enum") {
        if values.is_empty() {
            return "never".to_string();
        }
        return join(values.iter().map(literal), " | ");
    }
    for (keyword, separator) in [("anyOf", " | "), ("oneOf", " | "), ("allOf", " & ")] {
        if let Some(Value::Array(branches)) = object.get(keyword) {
            if branches.is_empty() {
                continue;
            }
            let parts = branches
                .iter()
                .map(|b| ts_type(b, root, defs, depth + 1))
                .map(|t| if t.contains(' ') { format!("({t})") } else { t });
            let combined = join(parts, separator);
            // Sibling keywords (e.g. properties beside allOf) narrow further.
            let rest: Map<String, Value> = object
                .iter()
                .filter(|(k, _)| {
                    !matches!(
                        k.as_str(),
                        "anyOf" | "oneOf" | "allOf" | "description" | "title"
                    )
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if rest.contains_key("type") || rest.contains_key("properties") {
                let own = base_type(&rest, root, defs, depth + 1);
                return format!("({combined}) & {own}");
            }
            return combined;
        }
    }
    match object.get("type") {
        Some(Value::Array(types)) => {
            let parts = types.iter().filter_map(Value::as_str).map(|t| {
                let mut single = object.clone();
                single.insert("type".into(), Value::String(t.to_string()));
                base_type(&single, root, defs, depth + 1)
            });
            join(parts, " | ")
        }
        Some(Value::String(t)) => match t.as_str() {
            "string" => "string".into(),
            "number" | "integer" => "number".into(),
            "boolean" => "boolean".into(),
            "null" => "null".into(),
            "array" => array_type(object, root, defs, depth),
            "object" => object_type(object, root, defs, depth),
            _ => "unknown".into(),
        },
        _ if object.contains_key("properties") => object_type(object, root, defs, depth),
        _ if object.contains_key("items") || object.contains_key("prefixItems") => {
            array_type(object, root, defs, depth)
        }
        _ => "unknown".into(),
    }
}

fn join(parts: impl Iterator<Item = String>, separator: &str) -> String {
    let mut seen = Vec::new();
    for part in parts {
        if !seen.contains(&part) {
            seen.push(part);
        }
    }
    if seen.is_empty() {
        "unknown".into()
    } else {
        seen.join(separator)
    }
}

fn array_type(
    object: &Map<String, Value>,
    root: &Value,
    defs: &mut Defs<'_>,
    depth: usize,
) -> String {
    // A tuple: `prefixItems` (2020-12) or an `items` array (draft 7).
    let tuple = match (object.get("prefixItems"), object.get("items")) {
        (Some(Value::Array(items)), rest) => Some((items, rest)),
        (None, Some(Value::Array(items))) => Some((items, object.get("additionalItems"))),
        _ => None,
    };
    if let Some((items, rest)) = tuple {
        let mut parts: Vec<String> = items
            .iter()
            .map(|i| ts_type(i, root, defs, depth + 1))
            .collect();
        match rest {
            Some(Value::Bool(false)) => {}
            Some(schema @ Value::Object(_)) => parts.push(format!(
                "...{}[]",
                wrap(ts_type(schema, root, defs, depth + 1))
            )),
            _ => parts.push("...unknown[]".into()),
        }
        return format!("[{}]", parts.join(", "));
    }
    match object.get("items") {
        Some(items) => format!("{}[]", wrap(ts_type(items, root, defs, depth + 1))),
        None => "unknown[]".into(),
    }
}

fn wrap(ty: String) -> String {
    if ty.contains(' ') {
        format!("({ty})")
    } else {
        ty
    }
}

fn object_type(
    object: &Map<String, Value>,
    root: &Value,
    defs: &mut Defs<'_>,
    depth: usize,
) -> String {
    let required: HashSet<&str> = object
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let indent = "  ".repeat(depth + 2);
    let mut fields = Vec::new();
    if let Some(Value::Object(properties)) = object.get("properties") {
        for (name, schema) in properties {
            let ty = ts_type(schema, root, defs, depth + 1);
            let description = schema
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("");
            let optional = if required.contains(name.as_str()) {
                ""
            } else {
                "?"
            };
            fields.push(format!(
                "{}{indent}{}{optional}: {ty};",
                doc(description, &indent),
                key(name)
            ));
        }
    }
    match object.get("additionalProperties") {
        Some(Value::Bool(false)) => {}
        Some(schema @ Value::Object(_)) => {
            let ty = ts_type(schema, root, defs, depth + 1);
            // Named properties must fit the index signature; widen when mixed.
            let ty = if fields.is_empty() {
                ty
            } else {
                "unknown".into()
            };
            fields.push(format!("{indent}[key: string]: {ty};"));
        }
        // Absent or true: JSON Schema allows more keys.
        _ if fields.is_empty() => return "Record<string, unknown>".into(),
        _ => fields.push(format!("{indent}[key: string]: unknown;")),
    }
    if fields.is_empty() {
        return "Record<string, never>".into();
    }
    format!("{{\n{}\n{}}}", fields.join("\n"), "  ".repeat(depth + 1))
}

#[cfg(test)]
mod tests;
