//! The library half of the `manifold` package: the config format, editing a
//! config file in place, importing other clients' server lists, and the
//! logging and metrics set-up, shared by the binary, its tests and the fuzz
//! targets (`fuzz/`).

pub mod config;
pub mod config_file;
pub mod import;
pub mod progress;
pub mod telemetry;
