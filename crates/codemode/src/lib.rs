//! Code mode: the model writes TypeScript against typed stubs, a sandbox runs
//! it, and every tool call goes back through the broker.
//!
//! This crate holds, so far, the stub generator ([`stubs`]: one `declare
//! namespace` per server, one function per tool, argument and result types
//! generated from the tool's JSON Schemas) and the TypeScript front end
//! ([`strip`]: types removed by oxc, or a syntax error with a caret), and the
//! worker's process isolation ([`isolation`]: namespaces, Landlock, rlimits,
//! seccomp, each layer reported).

pub mod engine;
pub mod isolation;
pub mod pool;
pub mod protocol;
pub mod runner;
pub mod strip;
pub mod stubs;
pub mod worker;

pub use runner::{CodeMode, Execution};
pub use strip::{SyntaxError, strip_types};
pub use stubs::{Bindings, StubTool, declarations, declarations_with, identifier};
