//! `manifold-bench code`: code mode's costs side by side in one run.
//!
//! - a cold run (strip, a fresh QuickJS context, one call answered at
//!   once), in process and through an isolated worker;
//! - the per-call cost of the bridge: a script's calls through the broker
//!   against the same calls made on the broker directly;
//! - many scripts at once through the worker pool.

use std::{sync::Arc, time::Instant};

use futures::{FutureExt, future::BoxFuture};
use manifold_broker::{Broker, CallRequest, Caller};
use manifold_catalog::{Principal, ToolCatalog};
use manifold_codemode::{
    CodeMode, Execution,
    engine::{Binding, Ending},
    pool::{RunEnd, RunLimits, Sandbox, SandboxConfig, SandboxMode, ToolCalls},
    strip_types,
};
use manifold_upstream::{Upstream, UpstreamConfig};
use rmcp::{
    ServiceExt,
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde_json::{Value, json};

use crate::{
    processes::{beside, start_gateway, start_http_fixture},
    stats::{percentile, us},
};

#[derive(Debug, clap::Args)]
pub struct CodeArgs {
    /// Cold runs per sandbox mode.
    #[arg(long, default_value_t = 300)]
    pub iterations: usize,
    /// Calls per script in the per-call measurement.
    #[arg(long, default_value_t = 100)]
    pub calls: usize,
    /// Scripts started at once in the concurrency measurement.
    #[arg(long, default_value_t = 100)]
    pub concurrent: usize,
    /// Workers in the pool for the concurrency measurement.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
}

const COLD_SCRIPT: &str = "const r: { content: unknown[] } = await bench.echo({ message: 'hi' });\nreturn r.content.length;";

/// Answers every call at once: the sandbox's own cost, no upstream.
struct Instant0;

impl ToolCalls for Instant0 {
    fn call(&self, tool: String, _args: Value) -> BoxFuture<'static, (bool, Value)> {
        async move {
            (
                true,
                json!({ "result": { "content": [] }, "server": "bench", "tool": tool }),
            )
        }
        .boxed()
    }
}

fn echo_binding() -> Vec<Binding> {
    vec![Binding {
        namespace: "bench".into(),
        function: "echo".into(),
        tool: "bench__echo".into(),
        structured: false,
    }]
}

/// A pool whose workers are the gateway's own (`manifold sandbox-worker`),
/// isolated as a default config isolates them.
async fn sandbox(mode: SandboxMode, workers: usize) -> anyhow::Result<Arc<Sandbox>> {
    let mut args = vec!["sandbox-worker".to_string()];
    args.push(serde_json::to_string(
        &manifold_codemode::isolation::IsolationConfig::default(),
    )?);
    Ok(Sandbox::start(SandboxConfig {
        mode,
        workers,
        program: beside("manifold")?,
        args,
        limits: RunLimits::default(),
        admission: Default::default(),
    })
    .await?)
}

fn completed(end: &RunEnd) -> bool {
    matches!(end, RunEnd::Engine(r) if r.ending == Ending::Completed)
}

pub async fn run(args: CodeArgs) -> anyhow::Result<()> {
    // Cold runs: strip + fresh context + one call, interleaved by block so
    // drift on a shared machine hits both modes alike.
    let in_process = sandbox(SandboxMode::InProcess, 1).await?;
    let worker = sandbox(SandboxMode::Process, 1).await?;
    let limits = RunLimits::default();
    let mut strip = Vec::new();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let block = 25;
    while a.len() < args.iterations {
        for (sandbox, samples) in [(&in_process, &mut a), (&worker, &mut b)] {
            for _ in 0..block {
                let t = Instant::now();
                let code = strip_types(COLD_SCRIPT).map_err(anyhow::Error::msg)?;
                strip.push(t.elapsed());
                let out = sandbox
                    .run("bench", code, echo_binding(), limits, Arc::new(Instant0))
                    .await?;
                anyhow::ensure!(completed(&out.end), "cold run failed: {:?}", out.end);
                samples.push(t.elapsed());
            }
        }
    }
    for v in [&mut a, &mut b, &mut strip] {
        v.sort();
    }
    println!(
        "cold run: strip + fresh QuickJS context + one call answered at once; {} runs each",
        a.len()
    );
    println!("{:<34} {:>9} {:>9}", "", "p50 µs", "p99 µs");
    println!(
        "{:<34} {:>9.0} {:>9.0}",
        "TypeScript strip alone (oxc)",
        us(percentile(&strip, 0.5)),
        us(percentile(&strip, 0.99))
    );
    println!(
        "{:<34} {:>9.0} {:>9.0}",
        "in process (thread)",
        us(percentile(&a, 0.5)),
        us(percentile(&a, 0.99))
    );
    println!(
        "{:<34} {:>9.0} {:>9.0}",
        "isolated worker process",
        us(percentile(&b, 0.5)),
        us(percentile(&b, 0.99))
    );
    println!(
        "ratio worker / in process: p50 {:.2}×",
        percentile(&b, 0.5).as_secs_f64() / percentile(&a, 0.5).as_secs_f64()
    );

    // Per-call: a real upstream behind the real broker (SQLite governance,
    // one audit row per call), called from a script and directly.
    let dir = std::env::temp_dir().join(format!("manifold-bench-code-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (_fixture, upstream_url) = start_http_fixture(&dir).await?;
    let (catalog, governance) = governed_catalog(&dir, &upstream_url).await?;
    let broker = Broker::new(catalog, governance);
    let caller = Caller::anonymous();
    let pool = sandbox(SandboxMode::Process, args.workers.max(1)).await?;
    let limits = RunLimits {
        max_calls: args.calls as u64 + 1,
        max_concurrent_calls: 1,
        ..RunLimits::default()
    };
    let code_mode = CodeMode::new(Arc::clone(&pool), Arc::clone(&broker), limits);
    let script = format!(
        "for (let i = 0; i < {}; i++) await bench.echo({{ message: 'hello' }});",
        args.calls
    );
    let direct_call = || {
        let request = CallRequest {
            caller: &caller,
            tool: "bench__echo",
            arguments: json!({"message": "hello"}).as_object().cloned(),
            approval_id: None,
            provenance: None,
            context: Default::default(),
        };
        broker.call(request)
    };
    for _ in 0..20 {
        direct_call().await?;
    }
    expect_ran(code_mode.execute(&caller, &script).await)?;
    let (mut direct, mut scripted) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..args.calls {
            direct_call().await?;
        }
        direct.push(t.elapsed() / args.calls as u32);
        let t = Instant::now();
        expect_ran(code_mode.execute(&caller, &script).await)?;
        scripted.push(t.elapsed() / args.calls as u32);
    }
    direct.sort();
    scripted.sort();
    let (d, s) = (percentile(&direct, 0.5), percentile(&scripted, 0.5));
    println!();
    println!(
        "per call, {} sequential calls to a Streamable HTTP upstream, median of 5 rounds",
        args.calls
    );
    println!("{:<34} {:>9.0} µs", "Broker::call directly", us(d));
    println!(
        "{:<34} {:>9.0} µs",
        "from a script (worker → broker)",
        us(s)
    );
    println!(
        "bridge overhead per call: {:.0} µs ({:.2}×)",
        us(s) - us(d),
        s.as_secs_f64() / d.as_secs_f64()
    );

    // Many scripts at once through the pool; each makes one real call.
    let one = "return (await bench.echo({ message: 'x' })).content.length;";
    let started = Instant::now();
    let runs = (0..args.concurrent).map(|_| {
        let code_mode = Arc::clone(&code_mode);
        let caller = caller.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let execution = code_mode.execute(&caller, one).await;
            (t.elapsed(), execution)
        })
    });
    let mut latencies = Vec::new();
    let mut failed = 0;
    for run in futures::future::join_all(runs).await {
        let (elapsed, execution) = run?;
        if expect_ran(execution).is_err() {
            failed += 1;
        }
        latencies.push(elapsed);
    }
    let total = started.elapsed();
    latencies.sort();
    println!();
    println!(
        "{} scripts at once, {} workers: all done in {:.0} ms ({:.0} scripts/s); latency p50 {:.1} ms, p99 {:.1} ms; {failed} failed",
        args.concurrent,
        args.workers,
        total.as_secs_f64() * 1e3,
        args.concurrent as f64 / total.as_secs_f64(),
        percentile(&latencies, 0.5).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn expect_ran(execution: Execution) -> anyhow::Result<()> {
    match execution {
        Execution::Ran { output, .. } if completed(&output.end) => Ok(()),
        other => anyhow::bail!("the script did not complete: {other:?}"),
    }
}

#[derive(Debug, clap::Args)]
pub struct TaskArgs {
    /// The scenario catalog (`logs` and `tickets` servers).
    #[arg(long, default_value = "fixtures/codemode/ops.jsonl")]
    pub catalog: std::path::PathBuf,
    /// The code-mode script for the task.
    #[arg(long, default_value = "fixtures/codemode/triage.ts")]
    pub script: std::path::PathBuf,
    #[arg(long, default_value_t = 10)]
    pub rounds: usize,
}

/// Seed 000's task (error logs → dedupe → one ticket each) done with direct
/// `call_tool` calls and with one `execute_code`, against a real gateway:
/// the tokens (o200k) that reach the model each way, and the wall time.
pub async fn run_task(args: TaskArgs) -> anyhow::Result<()> {
    use manifold_catalog::count_tokens;
    use rmcp::model::CallToolRequestParams;
    let script = std::fs::read_to_string(&args.script)?;
    let catalog = std::fs::canonicalize(&args.catalog)?;
    let dir = std::env::temp_dir().join(format!("manifold-bench-task-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let fixture = beside("manifold-fixture")?;
    let server = |name: &str| {
        format!(
            "[[servers]]\nname = \"{name}\"\ncommand = {:?}\nargs = [\"catalog\", \"--file\", {:?}, \"--server\", \"{name}\"]\n",
            fixture.display().to_string(),
            catalog.display().to_string()
        )
    };
    let config = dir.join("manifold.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nmode = \"progressive\"\n\n{}\n{}",
            server("logs"),
            server("tickets")
        ),
    )?;
    let (_gateway, url, _) = start_gateway(&config, "warn,manifold=info").await?;
    let client = http_client(&url).await?;
    let call = |name: &str, arguments: Value| {
        let mut p = CallToolRequestParams::new(name.to_string());
        p.arguments = arguments.as_object().cloned();
        client.peer().call_tool(p)
    };
    let text = |r: &rmcp::model::CallToolResult| -> String {
        r.content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect::<Vec<_>>()
            .join("\n")
    };

    let (mut direct_times, mut code_times) = (Vec::new(), Vec::new());
    let (mut direct_in, mut direct_out, mut code_in, mut code_out) = (0, 0, 0, 0);
    for _ in 0..args.rounds {
        // Direct: the model reads every line, then asks for each ticket.
        let t = Instant::now();
        let request = json!({"name": "logs__search_logs", "arguments": {}});
        let logs = call("call_tool", request.clone()).await?;
        let logs_text = text(&logs);
        let mut seen = Vec::new();
        let parsed: Value = serde_json::from_str(&logs_text)?;
        for line in parsed["lines"].as_array().into_iter().flatten() {
            if line["level"] == "error" && !seen.iter().any(|(_, m)| *m == line["message"]) {
                seen.push((line["service"].clone(), line["message"].clone()));
            }
        }
        let mut tokens_in = count_tokens(&logs_text);
        let mut tokens_out = count_tokens(&request.to_string());
        for (service, message) in &seen {
            let title = format!(
                "[{}] {}",
                service.as_str().unwrap_or(""),
                message.as_str().unwrap_or("")
            );
            let request = json!({"name": "tickets__create_ticket",
                "arguments": {"title": title, "priority": "high"}});
            let created = call("call_tool", request.clone()).await?;
            tokens_in += count_tokens(&text(&created));
            tokens_out += count_tokens(&request.to_string());
        }
        direct_times.push(t.elapsed());
        (direct_in, direct_out) = (tokens_in, tokens_out);

        // Code mode: one script; only its output comes back.
        let t = Instant::now();
        let request = json!({ "code": script });
        let result = call("execute_code", request.clone()).await?;
        code_times.push(t.elapsed());
        anyhow::ensure!(
            result.is_error != Some(true),
            "the script failed: {}",
            text(&result)
        );
        (code_in, code_out) = (
            count_tokens(&text(&result)),
            count_tokens(&request.to_string()),
        );
    }
    direct_times.sort();
    code_times.sort();
    let (d, c) = (percentile(&direct_times, 0.5), percentile(&code_times, 0.5));
    println!(
        "seed 000 task: error logs → dedupe → one ticket each ({} rounds, gateway over Streamable HTTP)",
        args.rounds
    );
    println!(
        "{:<12} {:>14} {:>14} {:>10} {:>14}",
        "", "tokens in", "tokens out", "total", "wall p50 ms"
    );
    println!(
        "{:<12} {:>14} {:>14} {:>10} {:>14.1}",
        "direct",
        direct_in,
        direct_out,
        direct_in + direct_out,
        d.as_secs_f64() * 1e3
    );
    println!(
        "{:<12} {:>14} {:>14} {:>10} {:>14.1}",
        "code mode",
        code_in,
        code_out,
        code_in + code_out,
        c.as_secs_f64() * 1e3
    );
    println!(
        "code mode / direct: tokens {:.3}×, wall {:.2}× (direct wall time excludes the model's own turns between calls)",
        (code_in + code_out) as f64 / (direct_in + direct_out) as f64,
        c.as_secs_f64() / d.as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The fixture at `upstream_url` as the only upstream of a catalog, and
/// governance as served: a SQLite store in `dir`, policies read and an
/// activity row written per call.
async fn governed_catalog(
    dir: &std::path::Path,
    upstream_url: &str,
) -> anyhow::Result<(Arc<ToolCatalog>, Arc<manifold_broker::Governance>)> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let upstream = Upstream::new(
        UpstreamConfig::http("bench", upstream_url),
        tx,
        Default::default(),
    );
    let catalog = ToolCatalog::new(vec![upstream], true);
    catalog.spawn_event_loop(rx, |_| {});
    catalog.connect_enabled().await;
    catalog.view(&Principal::anonymous()).await;
    let store = manifold_store::Store::open_data_dir(&dir.join("data")).await?;
    let governance = manifold_broker::Governance::new(store, Default::default());
    Ok((catalog, governance))
}

async fn http_client(
    url: &str,
) -> anyhow::Result<rmcp::service::RunningService<rmcp::RoleClient, ()>> {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url.to_string()),
    );
    Ok(().serve(transport).await?)
}
