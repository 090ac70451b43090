//! The `manifold.toml` format: its sections, reading and checking a config,
//! editing one in place ([`file`]), and importing other MCP clients' server
//! lists ([`import`]). Sections are plain data; the binary turns them into
//! each crate's settings, so this crate sits below the server, the broker
//! and the sandbox, and the fuzz targets parse configs through it alone.

mod auth;
mod code_mode;
mod config;
pub mod file;
mod gateway;
mod governance;
pub mod import;
mod telemetry;

pub use auth::{AuthSection, OidcCallerSettings, OidcSection, OneOrMany};
pub use code_mode::{CodeModeSection, SandboxSetting};
pub use config::Config;
pub use gateway::{AdminSection, AdmissionSection, GatewayConfig, ModeSetting, SearchSection};
pub use governance::{
    DEFAULT_AUDIT_RETENTION_DAYS, GovernanceSection, PolicySeed, StoreConfig, parse_policy,
};
pub use telemetry::{LogFormat, LogSection, TelemetrySection};

/// Serde's default for the settings that are on unless turned off.
fn yes() -> bool {
    true
}
