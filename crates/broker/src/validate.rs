use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use manifold_catalog::CatalogTool;
use rmcp::model::JsonObject;
use serde_json::Value;

/// Compiled `inputSchema` validators, memoized by definition hash so a changed
/// tool gets a fresh validator and an unchanged one is compiled once.
#[derive(Default)]
pub struct ArgumentValidator {
    compiled: Mutex<HashMap<String, Option<Arc<jsonschema::Validator>>>>,
}

/// Bound on the validators kept; tools beyond it are recompiled when seen again.
const MAX_COMPILED: usize = 20_000;

impl ArgumentValidator {
    /// Every violation of the tool's input schema, each with its JSON path.
    /// A schema that does not compile is the upstream's bug: it is logged and the
    /// call is passed on for the upstream to judge. `arguments` is only
    /// borrowed mutably to be wrapped as the `Value` the validator reads, and
    /// comes back unchanged: a clone would copy every argument.
    pub fn check(&self, tool: &CatalogTool, arguments: &mut JsonObject) -> Vec<String> {
        let Some(validator) = self.validator_for(tool) else {
            return Vec::new();
        };
        let instance = Value::Object(std::mem::take(arguments));
        let violations = validator
            .iter_errors(&instance)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() {
                    e.to_string()
                } else {
                    format!("{path}: {e}")
                }
            })
            .collect();
        let Value::Object(taken) = instance else {
            unreachable!("wrapped as an object above")
        };
        *arguments = taken;
        violations
    }

    fn validator_for(&self, tool: &CatalogTool) -> Option<Arc<jsonschema::Validator>> {
        if let Some(v) = self
            .compiled
            .lock()
            .expect("validator lock")
            .get(&tool.hash)
        {
            manifold_catalog::cache_lookup("validators", true);
            return v.clone();
        }
        manifold_catalog::cache_lookup("validators", false);
        let schema = Value::Object((*tool.definition.input_schema).clone());
        let compiled = match jsonschema::validator_for(&schema) {
            Ok(v) => Some(Arc::new(v)),
            Err(e) => {
                tracing::warn!(tool = %tool.qualified, error = %e, "input schema does not compile; skipping validation");
                None
            }
        };
        let mut map = self.compiled.lock().expect("validator lock");
        if map.len() >= MAX_COMPILED {
            map.clear();
        }
        map.insert(tool.hash.clone(), compiled.clone());
        compiled
    }
}
