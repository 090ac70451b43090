//! The library half of the `manifold` package: the config format and the
//! logging and metrics set-up, shared by the binary, its tests and the fuzz
//! targets (`fuzz/`).

pub mod config;
pub mod telemetry;
