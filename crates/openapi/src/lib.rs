//! OpenAPI 3.0 and 3.1 documents as MCP tools, and a tool call as the HTTP
//! request it stands for.
//!
//! - [`read`]: bytes (JSON or YAML, capped) into a JSON value, and the
//!   version check that refuses Swagger 2.0 and anything unreadable;
//! - [`schema`]: local `$ref`s resolved with cycles cut, and 3.0 schemas
//!   turned into JSON Schema 2020-12, within node and depth budgets;
//! - [`operations`]: each operation as one [`Operation`]: its tool (name,
//!   description, input and output schema, tier) and how to call it;
//! - [`names`]: tool names made safe, unique and short enough;
//! - [`request`]: a call's arguments into an HTTP request;
//! - [`response`]: an HTTP answer into a tool result;
//! - [`client`]: sending it, with timeouts and a size cap.
//!
//! The document is worked on as a JSON value rather than through typed
//! models (ARCHITECTURE.md, "Deviations"): one walk covers both versions,
//! and a field a typed model rejects costs one operation, not the document.

pub mod client;
mod names;
mod operations;
mod read;
mod request;
mod response;
mod schema;

pub use client::{CallError, ClientCredentials, HttpClient, fetch_document, read_document_file};
pub use operations::{BodyBinding, Location, Operation, Parameter, Skipped, Tier, ToolSpec};
pub use read::SpecVersion;
pub use request::{PreparedRequest, Target};
pub use response::{Outcome, outcome};

/// Bounds on what one document may cost.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The document's size, checked while it is read.
    pub max_document_bytes: usize,
    /// More operations than this and the document is refused.
    pub max_operations: usize,
    /// Nodes in one tool's input or output schema, after `$ref`s are
    /// expanded; an operation over it is skipped.
    pub max_schema_nodes: usize,
    /// Nodes over all tools of the document; past it the rest are skipped.
    pub max_total_schema_nodes: usize,
    /// How deeply a schema may nest, `$ref`s expanded.
    pub max_schema_depth: usize,
    /// The longest tool name (the qualified name's limit less the server's
    /// name and its `__`).
    pub max_tool_name_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_document_bytes: 8 * 1024 * 1024,
            max_operations: 1000,
            max_schema_nodes: 20_000,
            max_total_schema_nodes: 1_000_000,
            max_schema_depth: 48,
            max_tool_name_len: 64,
        }
    }
}

/// Which operations become tools: globs (`*` any run, `?` one character)
/// over the operation id or `METHOD /path`. An operation is chosen when no
/// `exclude` matches it and `include` is empty or one matches it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    pub include: Vec<String>,
    pub exclude: Vec<String>,
}

impl Selection {
    pub fn chooses(&self, operation_id: Option<&str>, label: &str) -> bool {
        let matches = |pattern: &String| {
            glob(pattern, label) || operation_id.is_some_and(|id| glob(pattern, id))
        };
        (self.include.is_empty() || self.include.iter().any(matches))
            && !self.exclude.iter().any(matches)
    }
}

/// Whether `text` matches `pattern`, with `*` any run of characters and `?`
/// one: the classic two-pointer match, linear in practice and never
/// exponential.
fn glob(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == '?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == '*' {
            star = Some((p, t));
            p += 1;
        } else if let Some((star_p, star_t)) = star {
            p = star_p + 1;
            t = star_t + 1;
            star = Some((star_p, star_t + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|c| *c == '*')
}

/// A document that cannot be used, and where: the file or URL, and the
/// place inside it when there is one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{place}: {message}")]
pub struct DocumentError {
    pub place: String,
    pub message: String,
}

impl DocumentError {
    pub(crate) fn new(place: &str, message: impl Into<String>) -> Self {
        Self {
            place: place.to_string(),
            message: message.into(),
        }
    }
}

/// A document read and turned into tools.
#[derive(Debug, Clone)]
pub struct Api {
    pub version: SpecVersion,
    pub title: String,
    /// The `url` of each `servers` entry, in order.
    pub servers: Vec<String>,
    /// The token URL of the first OAuth 2 client-credentials flow among
    /// the security schemes.
    pub client_credentials_token_url: Option<String>,
    pub operations: Vec<Operation>,
    /// Operations left out, with why.
    pub skipped: Vec<Skipped>,
}

impl Api {
    /// Reads a document (JSON or YAML) whose origin is `place` (a path or
    /// URL, for errors) and turns each operation into a tool.
    pub fn parse(bytes: &[u8], place: &str, limits: &Limits) -> Result<Self, DocumentError> {
        Self::parse_selected(bytes, place, limits, &Selection::default())
    }

    /// [`Api::parse`], keeping only the operations `selection` chooses
    /// (the operation limit counts only those).
    pub fn parse_selected(
        bytes: &[u8],
        place: &str,
        limits: &Limits,
        selection: &Selection,
    ) -> Result<Self, DocumentError> {
        let (document, version) = read::read(bytes, place, limits)?;
        operations::build(&document, version, place, limits, selection)
    }

    /// The operation behind the tool `name`.
    pub fn operation(&self, name: &str) -> Option<&Operation> {
        self.operations.iter().find(|op| op.tool.name == name)
    }
}
