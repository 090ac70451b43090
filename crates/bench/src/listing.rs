//! `manifold-bench listing`: what one governed tool listing costs in statements,
//! memory and time, at several catalog sizes, concurrencies and pool sizes,
//! on a throwaway database shaped like seed 001's (5 KB input schemas, 373
//! policies, one classification per tool, large unrelated rows).
//!
//! A listing here is what a direct-mode `tools/list` does after admission:
//! load the policy inputs, filter the caller's view, render the JSON. The
//! catalog itself is in memory (fetched from upstreams and cached), so it is
//! built once, outside the measurement.

use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use futures::future::join_all;
use manifold_broker::{Caller, Governance, GovernanceConfig};
use manifold_catalog::CatalogView;
use manifold_server::{Admission, AdmissionConfig};
use manifold_store::{
    Action, ActivityEvent, AuditCommit, AuditRow, AuditWriter, CallOutcome, Decision, Effect,
    NewPolicy, NewToken, PrincipalSelector, RiskTier, Store, StoreOptions, TierSelector,
    ToolStatus, now_ms,
};
use rmcp::model::{JsonObject, ListToolsResult, Tool, ToolAnnotations};
use serde::Serialize;
use serde_json::json;

use crate::alloc;

#[derive(clap::Args)]
pub struct ListingArgs {
    /// Catalog sizes (tools).
    #[arg(long, value_delimiter = ',', default_value = "50,300,900")]
    tools: Vec<usize>,
    /// Listings started at once.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    parallel: Vec<usize>,
    /// Database pool sizes.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    connections: Vec<u32>,
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    #[arg(long, value_enum, default_value = "sqlite")]
    database: Database,
    /// Write every run and every memory sample here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Database {
    Sqlite,
    Postgres,
}

const POLICIES: usize = 373;
const TOOLS_PER_SERVER: usize = 30;
const SAMPLE_EVERY: Duration = Duration::from_millis(2);
const SETTLE: Duration = Duration::from_millis(100);

#[derive(Serialize)]
struct Run {
    tools: usize,
    parallel: usize,
    connections: u32,
    repeat: usize,
    statements: u64,
    elapsed_ms: f64,
    /// Allocator high-water mark above the settled baseline.
    peak_extra_bytes: usize,
    visible_tools: usize,
    response_bytes: usize,
    /// Live bytes above the baseline, every 2 ms.
    samples: Vec<usize>,
}

/// An input schema of about 5 KB: a dozen documented properties.
fn schema(tool: usize) -> JsonObject {
    let mut properties = serde_json::Map::new();
    for p in 0..12 {
        properties.insert(
            format!("param_{p}"),
            json!({
                "type": if p % 3 == 0 { "integer" } else { "string" },
                "description": format!(
                    "Parameter {p} of tool {tool}. {}",
                    "It narrows what the tool does; see the upstream's documentation for details. ".repeat(5)
                ),
            }),
        );
    }
    json!({"type": "object", "properties": properties, "required": ["param_0"]})
        .as_object()
        .expect("an object")
        .clone()
}

fn catalog(tools: usize) -> CatalogView {
    let mut listings: Vec<(String, String, Vec<Tool>)> = Vec::new();
    for i in 0..tools {
        let server = i / TOOLS_PER_SERVER;
        if listings.len() <= server {
            listings.push((
                format!("srv{server}"),
                format!("Server {server}"),
                Vec::new(),
            ));
        }
        let mut tool = Tool::new(
            format!("t{i}_op"),
            format!("Tool {i}: does operation {i} on the server's records."),
            Arc::new(schema(i)),
        );
        let mut hints = ToolAnnotations::default();
        hints.read_only_hint = Some(i % 3 == 0);
        hints.destructive_hint = Some(i % 3 == 2);
        tool.annotations = Some(hints);
        listings[server].2.push(tool);
    }
    CatalogView::from_listings(listings, true)
}

/// Seed 001's token groups and its 373 policies, for the token `token_id`:
/// allow, rate-limit, approval and deny rules over 30 servers, most of them
/// for other principals.
pub(crate) async fn seed_001_policies(store: &Store, token_id: &str) -> anyhow::Result<()> {
    for group in ["g0", "g1", "g2"] {
        store.add_token_group(token_id, group).await?;
    }
    for i in 0..POLICIES {
        let principal = match i % 4 {
            0 => PrincipalSelector::Everyone,
            1 => PrincipalSelector::Group(format!("g{}", i % 8)),
            2 => PrincipalSelector::Token(format!("{:012x}", i)),
            _ => PrincipalSelector::Group("others".into()),
        };
        let effect = match i % 5 {
            0 | 1 => Effect::Allow,
            2 => Effect::RateLimit {
                limit: 1000,
                window_seconds: 60,
            },
            3 => Effect::RequireApproval,
            _ => Effect::Deny,
        };
        // Deny and approval rules are narrow, so most tools stay visible.
        let tool_glob = match effect {
            Effect::Deny | Effect::RequireApproval => format!("t{i}_*"),
            _ => "*".to_string(),
        };
        store
            .create_policy(NewPolicy {
                principal,
                server_glob: format!("srv{}", i % 30),
                tool_glob,
                tier: if i % 2 == 0 {
                    TierSelector::Any
                } else {
                    TierSelector::Only(RiskTier::ALL[i % 3])
                },
                effect,
                description: format!("rule {i}"),
            })
            .await?;
    }
    Ok(())
}

/// Seed 001's shape: many policies, one classification per tool, and large
/// rows discovery must never read. Returns the caller.
async fn fixture(store: &Store, view: &CatalogView) -> anyhow::Result<Caller> {
    let (token, _) = store
        .create_token(NewToken::new(
            "bench",
            [Action::Discover, Action::Call],
            ["*"],
        ))
        .await?;
    seed_001_policies(store, &token.id).await?;
    for tool in view.tools() {
        store
            .observe_tool(
                &tool.server,
                &tool.upstream_name,
                &tool.hash,
                ToolStatus::Approved,
                now_ms(),
            )
            .await?;
    }
    let snapshot = json!({ "snapshot": "s".repeat(400 * 1024) });
    let audit = AuditWriter::start(store.clone(), AuditCommit::Sync);
    for i in 0..20 {
        store
            .create_approval(
                &format!("token:{}", token.id),
                &format!("srv0__t{i}_op"),
                "h",
                &snapshot,
                i64::MAX,
            )
            .await?;
        audit
            .record(AuditRow::Activity(ActivityEvent {
                at: now_ms(),
                principal: format!("token:{}", token.id),
                token_id: Some(token.id.clone()),
                tool: "srv0__t0_op".into(),
                args_hash: format!("h{i}"),
                decision: Decision::Allowed,
                approval_id: None,
                outcome: CallOutcome::Success,
                latency_ms: 1,
                bytes_in: 10,
                bytes_out: 140 * 1024,
                details: json!({ "result": "r".repeat(140 * 1024) }),
            }))
            .await?;
    }
    audit.flush().await?;
    Ok(Caller::with_token(token))
}

/// One direct-mode `tools/list` after admission; returns (visible, bytes).
async fn listing(
    governance: &Governance,
    admission: &Admission,
    caller: &Caller,
    view: &CatalogView,
) -> anyhow::Result<(usize, usize)> {
    let _slot = admission.admit().await.context("admission refused")?;
    let visible = governance
        .visible(caller, view, Some("list"))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let tools: Vec<Tool> = visible.view.tools().map(|t| t.exposed()).collect();
    let count = tools.len();
    let body = serde_json::to_vec(&ListToolsResult::with_all_items(tools))?;
    Ok((count, body.len()))
}

async fn measure(
    store: &Store,
    caller: &Caller,
    view: &CatalogView,
    parallel: usize,
    repeat: usize,
) -> anyhow::Result<Run> {
    let governance = Governance::new(store.clone(), GovernanceConfig::default());
    let admission = Admission::new(AdmissionConfig::default());
    listing(&governance, &admission, caller, view).await?;
    tokio::time::sleep(SETTLE).await;

    let baseline = alloc::live_bytes();
    alloc::reset_peak();
    let done = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let (done, samples) = (Arc::clone(&done), Arc::clone(&samples));
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(SAMPLE_EVERY);
            while !done.load(Ordering::SeqCst) {
                ticks.tick().await;
                let extra = alloc::live_bytes().saturating_sub(baseline);
                samples.lock().expect("samples").push(extra);
            }
        })
    };
    let statements = store.statements();
    let started = Instant::now();
    let results =
        join_all((0..parallel).map(|_| listing(&governance, &admission, caller, view))).await;
    let elapsed = started.elapsed();
    let statements = store.statements() - statements;
    let peak = alloc::peak_bytes().saturating_sub(baseline);
    done.store(true, Ordering::SeqCst);
    sampler.await?;
    let mut visible = 0;
    let mut bytes = 0;
    for result in results {
        let (v, b) = result?;
        visible = v;
        bytes = b;
    }
    let samples = std::mem::take(&mut *samples.lock().expect("samples"));
    Ok(Run {
        tools: view.tool_count(),
        parallel,
        connections: 0,
        repeat,
        statements,
        elapsed_ms: elapsed.as_secs_f64() * 1e3,
        peak_extra_bytes: peak,
        visible_tools: visible,
        response_bytes: bytes,
        samples,
    })
}

pub async fn run(args: ListingArgs) -> anyhow::Result<()> {
    let max_tools = args.tools.iter().copied().max().unwrap_or(900);
    let _sqlite_dir;
    let url = match args.database {
        Database::Sqlite => {
            let dir = tempfile::tempdir()?;
            let url = manifold_store::sqlite_url(&dir.path().join("bench.db"));
            _sqlite_dir = dir;
            url
        }
        Database::Postgres => manifold_test_postgres::pg_cluster().create_database().await,
    };
    let setup = Store::connect(&url).await?;
    let full = catalog(max_tools);
    eprintln!("bench listing: building the fixture ({max_tools} tools, {POLICIES} policies) ...");
    let caller = fixture(&setup, &full).await?;
    setup.close().await;

    let mut runs = Vec::new();
    for &tools in &args.tools {
        let view = catalog(tools);
        for &connections in &args.connections {
            let store = Store::connect_with(
                &url,
                StoreOptions {
                    max_connections: connections.max(1),
                    ..Default::default()
                },
            )
            .await?;
            for &parallel in &args.parallel {
                for repeat in 0..args.repeat.max(1) {
                    let mut run = measure(&store, &caller, &view, parallel, repeat).await?;
                    run.connections = connections;
                    runs.push(run);
                }
            }
            store.close().await;
        }
    }
    print_table(&runs, args.database);
    if let Some(path) = &args.json {
        let out = json!({
            "database": args.database,
            "policies": POLICIES,
            "sample_every_ms": SAMPLE_EVERY.as_millis() as u64,
            "runs": runs,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&out)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("bench listing: every run and sample in {}", path.display());
    }
    Ok(())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

fn print_table(runs: &[Run], database: Database) {
    println!(
        "bench listing on {database:?}: medians of the repeats ({POLICIES} policies, 5 KB schemas)"
    );
    println!(
        "{:>6} {:>9} {:>6} {:>11} {:>10} {:>11} {:>8}",
        "tools", "parallel", "conns", "statements", "peak MiB", "elapsed ms", "visible"
    );
    let mut keys: Vec<(usize, usize, u32)> = runs
        .iter()
        .map(|r| (r.tools, r.parallel, r.connections))
        .collect();
    keys.dedup();
    for (tools, parallel, connections) in keys {
        let group: Vec<&Run> = runs
            .iter()
            .filter(|r| (r.tools, r.parallel, r.connections) == (tools, parallel, connections))
            .collect();
        println!(
            "{:>6} {:>9} {:>6} {:>11.0} {:>10.1} {:>11.1} {:>8}",
            tools,
            parallel,
            connections,
            median(group.iter().map(|r| r.statements as f64).collect()),
            median(
                group
                    .iter()
                    .map(|r| r.peak_extra_bytes as f64 / 1048576.0)
                    .collect()
            ),
            median(group.iter().map(|r| r.elapsed_ms).collect()),
            group[0].visible_tools,
        );
    }
    if !alloc::ENABLED {
        println!(
            "peak MiB reads 0: build with `-p manifold-bench --features alloc-stats` for the counting allocator"
        );
    }
    println!(
        "seed 001 (fixed): 900 tools × 1: 36 statements, 37 MiB, 240 ms; × 16: 576, 169–187 MiB, 3630 ms; \
         4 connections × 16: 624, 146–174 MiB, 3690 ms"
    );
}
