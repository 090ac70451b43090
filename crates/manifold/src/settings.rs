//! The config's sections as the settings each crate takes. The config crate
//! sits below the server, broker and sandbox and knows none of their types;
//! these conversions are where the two meet.

use std::time::Duration;

use manifold_broker::{AuditFailure, GovernanceConfig, QuarantineRules, guardrails::Guardrails};
use manifold_codemode::{
    isolation::IsolationConfig,
    pool::{RunAdmission, RunLimits, SandboxMode},
};
use manifold_config::{
    AdminSection, AdmissionSection, CodeModeSection, Config, GatewayConfig, ModeSetting,
    OidcSection, SandboxSetting,
};
use manifold_server::{AdmissionConfig, Mode, OidcCallers, admin::ops::RuntimeServers};

pub fn mode(setting: ModeSetting) -> Mode {
    match setting {
        ModeSetting::Auto => Mode::Auto,
        ModeSetting::Direct => Mode::Direct,
        ModeSetting::Progressive => Mode::Progressive,
    }
}

pub fn admission(section: &AdmissionSection) -> AdmissionConfig {
    AdmissionConfig {
        max_active: section.max_active.max(1),
        max_queued: section.max_queued,
        retry_after: Duration::from_secs(section.retry_after_seconds.max(1)),
    }
}

/// `[gateway]`'s bounds on legacy SSE sessions; the rest are the server's
/// own.
pub fn sse_limits(section: &GatewayConfig) -> manifold_server::http::sse::SseLimits {
    manifold_server::http::sse::SseLimits {
        max_sessions: section.max_sse_sessions,
        idle_timeout: Duration::from_secs(section.sse_idle_timeout_seconds.max(1)),
        ..Default::default()
    }
}

pub fn runtime_servers(section: &AdminSection) -> RuntimeServers {
    RuntimeServers {
        allow: section.allow_runtime_servers,
        allowed_commands: section.allowed_commands.clone(),
        allowed_hosts: section.allowed_hosts.clone(),
    }
}

/// `[auth.oidc]` as the server checks callers; `audience` is `[auth]
/// resource_url`. Without a scope mapping, `manifold:<action>` grants each
/// action.
pub fn oidc_callers(section: &OidcSection, audience: &str) -> anyhow::Result<OidcCallers> {
    let settings = section.callers(audience)?;
    Ok(OidcCallers {
        verifier: settings.verifier,
        scopes: settings.scopes.unwrap_or_else(OidcCallers::default_scopes),
    })
}

pub fn governance(config: &Config) -> anyhow::Result<GovernanceConfig> {
    let g = &config.governance;
    let mut governance = GovernanceConfig {
        default_effect: g.default_effect()?,
        quarantine: QuarantineRules {
            new_tools: g.quarantine_new_tools,
            changed_tools: g.quarantine_changed_tools,
        },
        approval_wait: Duration::from_secs(g.approval_wait_seconds),
        approval_ttl: Duration::from_secs(g.approval_ttl_seconds.max(1)),
        approval_webhook: g.approval_webhook.clone(),
        audit_arguments: g.audit_arguments,
        approval_elicitation: g.approval_elicitation,
        untrusted_servers: config
            .servers
            .iter()
            .filter(|s| s.untrusted)
            .map(|s| s.name.clone())
            .collect(),
        taint_rule: config.code_mode.taint_rule,
        guardrails: Guardrails {
            mask_secrets: g.mask_secrets,
            max_result_chars: g.max_result_chars,
        },
        audit_retention: (g.audit_retention_days > 0)
            .then(|| Duration::from_secs(g.audit_retention_days.saturating_mul(86_400))),
        audit_commit: g.audit_commit()?,
        failure_rows_per_minute: g.failure_rows_per_minute,
        audit_failure: if g.audit_failure_refuses()? {
            AuditFailure::Refuse
        } else {
            AuditFailure::Log
        },
        task_ttl: Duration::from_secs(config.gateway.task_ttl_seconds.max(1)),
        ..Default::default()
    };
    if let Some(keys) = &g.redact_keys {
        governance.redact_keys = keys.iter().map(|k| k.to_lowercase()).collect();
    }
    Ok(governance)
}

pub fn sandbox_mode(setting: SandboxSetting) -> SandboxMode {
    match setting {
        SandboxSetting::Process => SandboxMode::Process,
        SandboxSetting::InProcess => SandboxMode::InProcess,
    }
}

pub fn run_limits(section: &CodeModeSection) -> RunLimits {
    let mut limits = RunLimits::default();
    limits.engine.cpu_ms = section.cpu_ms.max(1);
    limits.engine.wall_ms = section.wall_ms.max(1);
    limits.engine.memory_bytes = section.memory_mb.max(1) << 20;
    limits.engine.log_bytes = section.max_output_bytes.saturating_mul(2).max(1024);
    limits.max_calls = section.max_calls;
    limits.max_concurrent_calls = section.max_concurrent_calls.max(1);
    limits.max_output_bytes = section.max_output_bytes;
    limits
}

pub fn run_admission(section: &CodeModeSection) -> RunAdmission {
    RunAdmission {
        max_queued: section.max_queued,
        max_runs_per_principal: section.max_runs_per_principal.max(1),
        queue_timeout: Duration::from_millis(section.queue_timeout_ms),
    }
}

pub fn isolation(section: &CodeModeSection) -> IsolationConfig {
    IsolationConfig {
        network_namespace: section.network_namespace,
        landlock: section.landlock,
        seccomp: section.seccomp,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The config's defaults are the sandbox's and the broker's own: an
    /// empty `[code_mode]` or `[governance]` changes nothing.
    #[test]
    fn defaults_match_the_crates_they_configure() {
        let section = CodeModeSection::default();
        let (limits, ours) = (RunLimits::default(), run_limits(&section));
        assert_eq!(ours.engine.cpu_ms, limits.engine.cpu_ms);
        assert_eq!(ours.engine.wall_ms, limits.engine.wall_ms);
        assert_eq!(ours.engine.memory_bytes, limits.engine.memory_bytes);
        assert_eq!(ours.max_calls, limits.max_calls);
        assert_eq!(ours.max_concurrent_calls, limits.max_concurrent_calls);
        assert_eq!(ours.max_output_bytes, limits.max_output_bytes);
        assert_eq!(run_admission(&section), RunAdmission::default());
        assert_eq!(isolation(&section), IsolationConfig::default());
        assert_eq!(sandbox_mode(section.sandbox), SandboxMode::default());
        let config = Config::parse("", "/tmp".into()).unwrap();
        assert_eq!(
            governance(&config).unwrap().audit_retention,
            GovernanceConfig::default().audit_retention
        );
        assert_eq!(
            manifold_config::DEFAULT_AUDIT_RETENTION_DAYS,
            manifold_broker::DEFAULT_AUDIT_RETENTION_DAYS
        );
        assert_eq!(
            governance(&config).unwrap().failure_rows_per_minute,
            GovernanceConfig::default().failure_rows_per_minute
        );
        assert_eq!(
            governance(&config).unwrap().audit_failure,
            GovernanceConfig::default().audit_failure
        );
        assert_eq!(mode(config.gateway.mode), Mode::default());
    }

    #[test]
    fn oidc_callers_default_to_one_scope_per_action() {
        let config = Config::parse(
            "[auth]\nresource_url = \"https://gw/mcp\"\n[auth.oidc]\nissuer = \"https://id\"\n",
            "/tmp".into(),
        )
        .unwrap();
        let callers = oidc_callers(config.auth.oidc.as_ref().unwrap(), "https://gw/mcp").unwrap();
        assert_eq!(
            callers.scopes.keys().collect::<Vec<_>>(),
            [
                "manifold:admin",
                "manifold:call",
                "manifold:code",
                "manifold:discover"
            ]
        );
    }
}
