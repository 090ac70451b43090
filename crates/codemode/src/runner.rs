//! Code mode as the gateway runs it: TypeScript in, types stripped, a
//! worker runs the script, and every stub call comes back here to go
//! through [`Broker::call`] like any direct `call_tool`.
//!
//! The broker is the security boundary. The worker's isolation is defence
//! in depth: even a script that escaped QuickJS could only ask this bridge
//! for calls, and the bridge asks the broker.

use std::sync::{Arc, Mutex};

use futures::{FutureExt, future::BoxFuture};
use manifold_broker::{Broker, BrokerError, CallRequest, Caller, Provenance};
use manifold_catalog::CatalogView;
use rmcp::model::CallToolResponse;
use serde::Serialize;
use serde_json::{Value as Json, json};

use crate::{
    Bindings,
    engine::Binding,
    pool::{RunLimits, RunOutput, Sandbox, SandboxError, ToolCalls},
    strip_types,
};

/// The code-mode service: a sandbox and the broker its calls go through.
pub struct CodeMode {
    sandbox: Arc<Sandbox>,
    broker: Arc<Broker>,
    limits: RunLimits,
    bindings: Mutex<Option<(u64, Arc<Bindings>)>>,
    /// Why no script may run (an isolation layer is missing and isolation
    /// is required): code mode fails closed.
    refusal: Option<String>,
}

/// One run as the surface reports it.
#[derive(Debug, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Execution {
    /// The script did not parse; nothing ran.
    SyntaxError { error: String },
    Ran {
        #[serde(flatten)]
        output: Box<RunOutput>,
        /// Untrusted servers the run read from.
        untrusted_reads: Vec<String>,
    },
    /// No worker could be started, or isolation is required and missing.
    Unavailable { error: String },
    /// Refused for capacity; nothing ran.
    Busy { error: String, retry_after_ms: u64 },
    /// The broker refused the run (the token lacks the `code` action, or
    /// is no longer valid); nothing ran.
    Refused { refusal: Json },
}

impl CodeMode {
    pub fn new(sandbox: Arc<Sandbox>, broker: Arc<Broker>, limits: RunLimits) -> Arc<Self> {
        Self::refusing(sandbox, broker, limits, None)
    }

    /// Code mode that answers every run with `refusal` when it is set.
    pub fn refusing(
        sandbox: Arc<Sandbox>,
        broker: Arc<Broker>,
        limits: RunLimits,
        refusal: Option<String>,
    ) -> Arc<Self> {
        Arc::new(CodeMode {
            sandbox,
            broker,
            limits,
            bindings: Mutex::new(None),
            refusal,
        })
    }

    pub fn sandbox(&self) -> &Arc<Sandbox> {
        &self.sandbox
    }

    pub fn limits(&self) -> &RunLimits {
        &self.limits
    }

    /// Script names for `view`, cached while the catalog stays the same.
    pub fn bindings(&self, view: &CatalogView) -> Arc<Bindings> {
        let mut cached = self.bindings.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((key, bindings)) = cached.as_ref()
            && *key == view.key
        {
            manifold_catalog::cache_lookup("code_bindings", true);
            return Arc::clone(bindings);
        }
        manifold_catalog::cache_lookup("code_bindings", false);
        let bindings = Arc::new(Bindings::new(
            view.tools().map(|t| (t.server.as_str(), t.name.as_str())),
        ));
        *cached = Some((view.key, Arc::clone(&bindings)));
        bindings
    }

    /// Runs `source` (TypeScript or JavaScript) for `caller`, once the
    /// broker allowed the run; each call the script makes is decided again.
    pub async fn execute(&self, caller: &Caller, source: &str) -> Execution {
        if let Err(refusal) = self.broker.allow_code(caller).await {
            return Execution::Refused {
                refusal: refusal.to_json(),
            };
        }
        if let Some(refusal) = &self.refusal {
            return Execution::Unavailable {
                error: refusal.clone(),
            };
        }
        let code = match strip_types(source) {
            Ok(code) => code,
            Err(error) => {
                return Execution::SyntaxError {
                    error: error.to_string(),
                };
            }
        };
        let view = self.broker.catalog().view(&caller.principal).await;
        let bindings = self.bindings(&view);
        // Only namespaces the script names are bound: a 10,000-tool catalog
        // costs a run nothing it does not use.
        let bound: Vec<Binding> = view
            .tools()
            .filter_map(|t| {
                let namespace = bindings.namespace(&t.server)?;
                if !code.contains(namespace) {
                    return None;
                }
                Some(Binding {
                    namespace: namespace.to_string(),
                    function: bindings.function(&t.server, &t.name)?.to_string(),
                    tool: t.qualified.clone(),
                    structured: t.definition.output_schema.is_some(),
                })
            })
            .collect();
        let provenance = Arc::new(Provenance::default());
        let calls = Arc::new(BrokerCalls {
            broker: Arc::clone(&self.broker),
            view: Arc::clone(&view),
            caller: caller.clone(),
            provenance: Arc::clone(&provenance),
        });
        let run = self
            .sandbox
            .run(&caller.principal.0, code, bound, self.limits, calls)
            .await;
        match run {
            Ok(output) => Execution::Ran {
                output: Box::new(output),
                untrusted_reads: provenance.untrusted_reads(),
            },
            Err(SandboxError::Busy {
                reason,
                retry_after,
            }) => Execution::Busy {
                error: reason,
                retry_after_ms: u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX),
            },
            Err(error) => Execution::Unavailable {
                error: error.to_string(),
            },
        }
    }
}

/// Stub calls of one run, answered by the broker on the caller's behalf.
struct BrokerCalls {
    broker: Arc<Broker>,
    /// The view the run's bindings came from; every call resolves in it.
    view: Arc<CatalogView>,
    caller: Caller,
    provenance: Arc<Provenance>,
}

impl ToolCalls for BrokerCalls {
    fn call(&self, tool: String, args: Json) -> BoxFuture<'static, (bool, Json)> {
        let broker = Arc::clone(&self.broker);
        let view = Arc::clone(&self.view);
        let caller = self.caller.clone();
        let provenance = Arc::clone(&self.provenance);
        async move {
            let (server, name) = match view.tool(&tool) {
                Some(t) => (json!(t.server), json!(t.name)),
                None => (Json::Null, json!(tool)),
            };
            let arguments = match args {
                Json::Object(map) => Some(map),
                Json::Null => None,
                _ => {
                    let message = format!("the arguments of '{tool}' must be an object");
                    return (false, refusal("invalid_arguments", message, server, name));
                }
            };
            let request = CallRequest {
                caller: &caller,
                tool: &tool,
                arguments,
                approval_id: None,
                provenance: Some(&provenance),
                context: Default::default(),
            };
            // A tool that runs only as a task is awaited here: a script never
            // sees a task handle.
            match broker.call_awaiting_task(&view, request).await {
                Ok(CallToolResponse::Complete(result)) => {
                    let value = serde_json::to_value(&result).unwrap_or(Json::Null);
                    if result.is_error == Some(true) {
                        let first = result
                            .content
                            .iter()
                            .find_map(|c| c.as_text().map(|t| t.text.clone()))
                            .unwrap_or_default();
                        let message = format!("'{tool}' reported an error: {first}");
                        let mut error = refusal("tool_error", message, server, name);
                        error["content"] = value["content"].clone();
                        (false, error)
                    } else {
                        (
                            true,
                            json!({ "result": value, "server": server, "tool": name }),
                        )
                    }
                }
                Ok(_) => {
                    let message = format!(
                        "'{tool}' asked for input or answered with a task, which code mode cannot \
                         answer; call it with call_tool"
                    );
                    (false, refusal("unsupported_result", message, server, name))
                }
                Err(BrokerError::Refused(refused)) => {
                    let mut error = refused.to_json();
                    error["code"] = json!(refused.code());
                    error["server"] = server;
                    error["tool"] = name;
                    (false, error)
                }
                Err(error @ (BrokerError::UnknownTool { .. } | BrokerError::Unknown { .. })) => (
                    false,
                    refusal("unknown_tool", error.to_string(), server, name),
                ),
                Err(error @ BrokerError::InvalidArguments { .. }) => (
                    false,
                    refusal("invalid_arguments", error.to_string(), server, name),
                ),
                Err(BrokerError::Upstream(error)) => (
                    false,
                    refusal("upstream_error", error.to_string(), server, name),
                ),
                Err(BrokerError::AuditUnavailable(error)) => (
                    false,
                    refusal(
                        manifold_broker::AuditUnavailable::CODE,
                        error.to_string(),
                        server,
                        name,
                    ),
                ),
            }
        }
        .boxed()
    }
}

fn refusal(code: &str, message: String, server: Json, tool: Json) -> Json {
    json!({ "code": code, "message": message, "server": server, "tool": tool, "content": [] })
}
