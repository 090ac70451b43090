//! What an operator does to one recorded tool: approve its definition,
//! quarantine it, set its tier.

use manifold_store::{RiskTier, Store, ToolClassification};

use crate::{AdminError, Result};

/// How many leading digits of a definition hash identify it (what `tools
/// list` shows, and the least an approval accepts).
pub const HASH_PREFIX: usize = 12;

/// What an operator does to one tool.
#[derive(Debug, Clone)]
pub enum ToolAction {
    /// Approve the definition the operator reviewed (its hash, or a prefix
    /// of at least [`HASH_PREFIX`] digits), lifting quarantine. Refused when
    /// the definition has changed since.
    Approve {
        reviewed_hash: String,
    },
    Quarantine,
    /// Set (or with `None` clear) the tier.
    Classify(Option<RiskTier>),
}

pub async fn tool_action(
    store: &Store,
    server: &str,
    tool: &str,
    action: ToolAction,
) -> Result<ToolClassification> {
    Ok(match action {
        ToolAction::Approve { reviewed_hash } => {
            let known = store
                .tool_classification(server, tool)
                .await?
                .ok_or_else(|| AdminError::NotFound(format!("no recorded tool {server}/{tool}")))?;
            let reviewed = reviewed_hash.trim();
            if reviewed.len() < HASH_PREFIX {
                return Err(AdminError::Invalid(format!(
                    "give the definition hash you reviewed (at least {HASH_PREFIX} digits)"
                )));
            }
            if !known.definition_hash.starts_with(reviewed) {
                return Err(AdminError::Conflict(format!(
                    "{server}/{tool} changed since it was reviewed: reviewed definition {reviewed}, \
                     current definition {}; review the current one and approve its hash",
                    known.definition_hash
                )));
            }
            // The store checks the full hash again in the same statement, so
            // a change between this read and the update is refused too.
            store
                .approve_tool(server, tool, &known.definition_hash)
                .await?
        }
        ToolAction::Quarantine => store.quarantine_tool(server, tool).await?,
        ToolAction::Classify(tier) => store.classify_tool(server, tool, tier).await?,
    })
}
