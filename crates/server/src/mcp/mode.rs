use manifold_catalog::CatalogView;
use serde::{Deserialize, Serialize};

/// How tools reach the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Decide from the size of the catalog.
    #[default]
    Auto,
    /// Expose every tool under its qualified name.
    Direct,
    /// Expose only the meta-tools.
    Progressive,
}

/// The mode chosen, and the figures it was chosen from.
#[derive(Debug, Clone, Serialize)]
pub struct ModeDecision {
    pub configured: Mode,
    pub chosen: Mode,
    pub tools: usize,
    pub definition_tokens: usize,
    pub threshold_tokens: usize,
}

/// `auto` goes progressive when the definitions exceed `threshold_percent` of
/// the context window; the seed recommends 1–5 %.
pub fn decide_mode(
    configured: Mode,
    view: &CatalogView,
    context_window_tokens: usize,
    threshold_percent: f64,
) -> ModeDecision {
    let definition_tokens = view.definition_tokens();
    let threshold_tokens = (context_window_tokens as f64 * threshold_percent / 100.0) as usize;
    let chosen = match configured {
        Mode::Auto if definition_tokens > threshold_tokens => Mode::Progressive,
        Mode::Auto => Mode::Direct,
        other => other,
    };
    ModeDecision {
        configured,
        chosen,
        tools: view.tool_count(),
        definition_tokens,
        threshold_tokens,
    }
}
