//! Tool catalogs stored as JSON lines, one tool a line:
//! `{"id", "server", "server_description"?, "name", "description", "input_schema"}`.
//! Used by the benchmarks and the search evaluation.

use std::{collections::BTreeMap, path::Path, sync::Arc};

use rmcp::model::Tool;
use serde::Deserialize;

#[derive(Deserialize)]
struct Row {
    id: String,
    server: String,
    #[serde(default)]
    server_description: Option<String>,
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    input_schema: Option<serde_json::Value>,
}

/// Tools grouped by server, in first-seen order, plus each row's id with its
/// `(server, tool name)`.
pub struct JsonlCatalog {
    pub listings: Vec<(String, String, Vec<Tool>)>,
    pub ids: Vec<(String, String, String)>,
}

pub fn read_catalogs(paths: &[impl AsRef<Path>]) -> Result<JsonlCatalog, String> {
    let mut order: Vec<String> = Vec::new();
    let mut groups: BTreeMap<String, (String, Vec<Tool>)> = BTreeMap::new();
    let mut ids = Vec::new();
    for path in paths {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let row: Row = serde_json::from_str(line)
                .map_err(|e| format!("{}:{}: {e}", path.display(), n + 1))?;
            // Lowercased, as the fixture servers name the same catalogs'
            // servers (`manifold-fixture catalog --server`).
            let server = crate::server_name(&row.server.to_lowercase());
            let schema = match row.input_schema {
                Some(serde_json::Value::Object(map)) => map,
                _ => serde_json::json!({"type": "object"})
                    .as_object()
                    .cloned()
                    .expect("object literal"),
            };
            let tool = Tool::new(
                row.name.clone(),
                row.description.unwrap_or_default(),
                Arc::new(schema),
            );
            let entry = groups.entry(server.clone()).or_insert_with(|| {
                order.push(server.clone());
                (
                    row.server_description.clone().unwrap_or_default(),
                    Vec::new(),
                )
            });
            if !entry.1.iter().any(|t| t.name == tool.name) {
                entry.1.push(tool);
            }
            ids.push((row.id, server, row.name));
        }
    }
    let listings = order
        .into_iter()
        .map(|server| {
            let (description, tools) = groups.remove(&server).expect("grouped");
            (server, description, tools)
        })
        .collect();
    Ok(JsonlCatalog { listings, ids })
}
