//! `[code_mode]`: the `execute_code` meta-tool and its sandbox.

use serde::Deserialize;

/// Code mode: the `execute_code` meta-tool and its sandbox. Every field has
/// a default.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CodeModeSection {
    pub enabled: bool,
    /// `process` (isolated workers) or `in_process` (a thread; no isolation).
    pub sandbox: SandboxSetting,
    /// Workers kept started, which is also how many scripts run at once.
    pub workers: usize,
    pub cpu_ms: u64,
    pub wall_ms: u64,
    pub memory_mb: usize,
    pub max_calls: u64,
    pub max_concurrent_calls: usize,
    pub max_output_bytes: usize,
    /// After a run read from an `untrusted` server, writes to another server
    /// need approval.
    pub taint_rule: bool,
    /// Refuse every run (a clear error from `execute_code`) when an
    /// isolation layer cannot be applied. On by default: code mode fails
    /// closed. `false`, or `sandbox = "in_process"`, are explicit opt-outs
    /// that `manifold doctor` reports.
    pub require_isolation: bool,
    /// Runs that may wait for a worker at once; the next gets
    /// `code_mode_busy`.
    pub max_queued: usize,
    /// Runs one caller may have running or waiting at once.
    pub max_runs_per_principal: usize,
    /// How long a run waits for a worker before `code_mode_busy`.
    pub queue_timeout_ms: u64,
    pub network_namespace: bool,
    pub landlock: bool,
    pub seccomp: bool,
}

impl Default for CodeModeSection {
    /// The sandbox's own defaults (`manifold_codemode`'s `RunLimits`,
    /// `RunAdmission` and `IsolationConfig`; a test in the binary holds them
    /// equal).
    fn default() -> Self {
        CodeModeSection {
            enabled: true,
            sandbox: SandboxSetting::default(),
            workers: 2,
            cpu_ms: 5_000,
            wall_ms: 30_000,
            memory_mb: 64,
            max_calls: 50,
            max_concurrent_calls: 8,
            max_output_bytes: 16 << 10,
            taint_rule: true,
            require_isolation: true,
            max_queued: 16,
            max_runs_per_principal: 2,
            queue_timeout_ms: 30_000,
            network_namespace: true,
            landlock: true,
            seccomp: true,
        }
    }
}

/// `[code_mode] sandbox`: where scripts run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SandboxSetting {
    /// Pre-started worker processes, isolated from the gateway.
    #[default]
    Process,
    /// A thread of the gateway: no process isolation.
    InProcess,
}
