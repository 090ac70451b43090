//! `execute_code` results as the model reads them: the script's output,
//! then its value or error, then why it stopped if it did not finish.

use manifold_codemode::{
    Execution,
    engine::{Ending, Stream},
    pool::{RunEnd, RunLimits},
};
use rmcp::model::{CallToolResult, ContentBlock as Content};

/// Counts one run by how it ended, for `/metrics`.
pub(crate) fn record_run(execution: &Execution, elapsed: std::time::Duration) {
    let ending = match execution {
        Execution::SyntaxError { .. } => "syntax_error",
        Execution::Unavailable { .. } => "unavailable",
        Execution::Busy { .. } => "busy",
        Execution::Refused { .. } => "refused",
        Execution::Ran { output, .. } => match &output.end {
            RunEnd::Engine(report) => match report.ending {
                Ending::Completed => "completed",
                Ending::Threw => "threw",
                Ending::CpuDeadline => "cpu_deadline",
                Ending::WallDeadline => "wall_deadline",
                Ending::MemoryLimit => "memory_limit",
            },
            RunEnd::WorkerLost { .. } => "worker_lost",
            RunEnd::Unresponsive => "unresponsive",
        },
    };
    metrics::counter!("manifold_code_runs_total", "ending" => ending).increment(1);
    metrics::histogram!("manifold_code_run_duration_seconds").record(elapsed.as_secs_f64());
}

pub(crate) fn render(execution: &Execution, limits: &RunLimits) -> CallToolResult {
    let (text, failed) = match execution {
        Execution::Busy {
            error,
            retry_after_ms,
        } => {
            // Like discovery's 503 `tool_discovery_busy`: a code and when to
            // try again, so a client can back off instead of failing the task.
            return CallToolResult::structured_error(serde_json::json!({
                "error": "code_mode_busy",
                "message": format!("{error}; nothing ran. Try again in {retry_after_ms} ms."),
                "retry_after_ms": retry_after_ms,
            }));
        }
        // The same structured error as a refused call_tool.
        Execution::Refused { refusal } => {
            return CallToolResult::structured_error(refusal.clone());
        }
        Execution::SyntaxError { error } => (format!("{error}\nNothing ran."), true),
        Execution::Unavailable { error } => (format!("The sandbox is unavailable: {error}"), true),
        Execution::Ran {
            output,
            untrusted_reads: _,
        } => {
            let mut text = String::new();
            for (stream, line) in &output.logs {
                if *stream == Stream::Err {
                    text.push_str("[stderr] ");
                }
                text.push_str(line);
                text.push('\n');
            }
            if output.truncated_bytes > 0 {
                text.push_str(&format!(
                    "[output truncated: {} more bytes not shown; the limit is {} bytes]\n",
                    output.truncated_bytes, limits.max_output_bytes
                ));
            }
            let failed = match &output.end {
                RunEnd::Engine(report) => {
                    match report.ending {
                        Ending::Completed => {
                            if let Some(value) = &report.value {
                                text.push_str(&format!("Returned: {value}\n"));
                            }
                        }
                        Ending::Threw => {
                            if let Some(error) = &report.error {
                                text.push_str(&format!(
                                    "Uncaught {}: {}\n",
                                    error.name, error.message
                                ));
                                if let Some(stack) = &error.stack {
                                    text.push_str(stack);
                                    text.push('\n');
                                }
                            }
                        }
                        Ending::CpuDeadline => text.push_str(&format!(
                            "Stopped: the script used its {} ms of CPU time.\n",
                            limits.engine.cpu_ms
                        )),
                        Ending::WallDeadline => text.push_str(&format!(
                            "Stopped: the script ran past its {} ms wall-clock deadline.\n",
                            limits.engine.wall_ms
                        )),
                        Ending::MemoryLimit => text.push_str(&format!(
                            "Stopped: the script passed its {} MiB memory limit.\n",
                            limits.engine.memory_bytes >> 20
                        )),
                    }
                    report.ending != Ending::Completed
                }
                RunEnd::WorkerLost { reason } => {
                    text.push_str(&format!(
                        "Stopped: the sandbox worker died ({reason}); it has been replaced.\n"
                    ));
                    true
                }
                RunEnd::Unresponsive => {
                    text.push_str(
                        "Stopped: the sandbox worker stopped answering and was killed.\n",
                    );
                    true
                }
            };
            if output.calls_over_cap > 0 {
                text.push_str(&format!(
                    "{} tool calls were refused: the limit is {} per run.\n",
                    output.calls_over_cap, limits.max_calls
                ));
            }
            (text, failed)
        }
    };
    // Text only: a structured copy would double what reaches the model.
    if failed {
        CallToolResult::error(vec![Content::text(text)])
    } else {
        CallToolResult::success(vec![Content::text(text)])
    }
}
