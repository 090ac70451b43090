//! The code-mode engine and the stubs' TypeScript, one binary. The isolation
//! tests are a binary of their own (`isolation.rs`): they need their own `main`.

mod engine;
mod parse;
