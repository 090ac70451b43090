//! The registry of every upstream tool, grouped by server.
//!
//! The catalog memoizes each upstream's `tools/list`, honours `ttlMs` and
//! `cacheScope` (a private or unscoped listing is cached per caller), goes stale
//! the moment a `list_changed` arrives, and serves the last good listing with a
//! stale marker when an upstream fails. It gives each tool a qualified name and a
//! content hash, and counts definition tokens. [`PrimitiveCatalog`] lists the
//! same upstreams' prompts, resources and resource templates for direct mode and
//! knows which server serves each.

pub mod jsonl;
mod names;
mod primitives;
mod registry;
mod summary;
mod tokens;
mod tool;

pub use names::{MAX_NAME_LEN, qualify, server_name, split_qualified};
pub use primitives::{Listed, PrimitiveCatalog, template_matches};
pub use registry::{CatalogView, Principal, ServerView, ToolCatalog, cache_lookup};
pub use summary::one_line;
pub use tokens::count_tokens;
pub use tool::{CallEnd, CatalogTool};
