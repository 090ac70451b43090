//! `manifold-bench call`: what one governed `tools/call` costs over a call
//! straight to the upstream, measured side by side in one run.
//!
//! The upstream (`manifold-fixture catalog`, an rmcp Streamable HTTP server)
//! and the gateway (`manifold serve`, direct mode) are processes of their
//! own; this process only drives them over loopback with raw JSON-RPC on
//! keep-alive connections. The gateway's CPU time is read from
//! `/proc/<pid>/stat` around the gateway's own blocks, so it is the
//! operating system's figure, not an estimate.
//!
//! 1. sequential: one caller, calls alternating in blocks between the two
//!    paths, for latency;
//! 2. concurrent: `--concurrency` callers, one-second blocks alternating
//!    between the paths, for throughput and CPU per call.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use manifold_cli::progress::Progress;
use manifold_store::{Action, NewToken, Store};
use serde::Serialize;
use serde_json::json;

use crate::{
    floor,
    listing::seed_001_policies,
    processes::{rss_kib, start_gateway, start_http_fixture},
    stats::{percentile, us},
};

#[derive(clap::Args)]
pub struct CallArgs {
    /// Sequential calls per path.
    #[arg(long, default_value_t = 2000)]
    pub iterations: usize,
    /// Concurrent callers in the throughput phase.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Length of the throughput phase per path, in seconds.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Auth on, calls under a gateway token, and seed 001's 373 policies.
    #[arg(long)]
    pub auth: bool,
    /// `[governance] audit_commit` for the gateway: sync (default) or async.
    #[arg(long, default_value = "sync")]
    pub audit_commit: String,
    /// `[gateway] fast_calls` for the gateway: on (default) or off, which
    /// sends every call through rmcp's per-request machinery.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub fast_calls: bool,
    /// Also measure nginx as a plain reverse proxy to the same upstream
    /// (when nginx is installed): the floor one hop reaches here.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub floor: bool,
    /// Also write the figures here as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Serialize, Default)]
struct Side {
    p50_us: f64,
    p99_us: f64,
    requests_per_second: f64,
    calls: u64,
    failures: u64,
}

#[derive(Serialize)]
struct Report {
    auth: bool,
    audit_commit: String,
    fast_calls: bool,
    direct: Side,
    gateway: Side,
    added_p50_us: f64,
    throughput_ratio: f64,
    /// Gateway user + system CPU per call, sequential phase.
    cpu_us_per_call_sequential: f64,
    /// The same under `concurrency` callers.
    cpu_us_per_call_concurrent: f64,
    /// Context switches of the gateway's threads per call, sequential phase:
    /// each is a thread that slept and was woken, which on a virtual machine
    /// costs more than most of the call's own work.
    switches_per_call_sequential: f64,
    /// The same under `concurrency` callers.
    switches_per_call_concurrent: f64,
    gateway_rss_mib: f64,
    /// Connections the gateway opened to the upstream in the whole run.
    upstream_connections: Option<u64>,
    audit_rows: i64,
    /// nginx as a plain reverse proxy to the same upstream, when installed.
    floor: Option<Floor>,
}

/// The plain hop's figures, as the gateway's are given.
#[derive(Serialize)]
struct Floor {
    hop: Side,
    added_p50_us: f64,
    throughput_ratio: f64,
    cpu_us_per_call_sequential: f64,
    cpu_us_per_call_concurrent: f64,
}

/// One path's calls and, for a process in the path, its CPU and switches.
struct Lane {
    target: Arc<Target>,
    pid: Option<u32>,
    latencies: Vec<Duration>,
    failures: u64,
    /// Concurrent calls and the time they took.
    calls: u64,
    time: Duration,
    sequential: Usage,
    concurrent: Usage,
}

/// CPU time and context switches of one process, summed over blocks.
#[derive(Default, Clone, Copy)]
struct Usage {
    cpu: Duration,
    switches: u64,
}

impl Usage {
    fn add(&mut self, after: Usage, before: Usage) {
        self.cpu += after.cpu.saturating_sub(before.cpu);
        self.switches += after.switches.saturating_sub(before.switches);
    }

    fn cpu_per_call(&self, calls: u64) -> f64 {
        us(self.cpu) / calls.max(1) as f64
    }

    fn switches_per_call(&self, calls: u64) -> f64 {
        self.switches as f64 / calls.max(1) as f64
    }
}

impl Lane {
    fn new(target: Arc<Target>, pid: Option<u32>) -> Self {
        Self {
            target,
            pid,
            latencies: Vec::new(),
            failures: 0,
            calls: 0,
            time: Duration::ZERO,
            sequential: Usage::default(),
            concurrent: Usage::default(),
        }
    }

    /// The process's CPU and switches so far; zero with no process.
    fn usage(&self) -> anyhow::Result<Usage> {
        let Some(pid) = self.pid else {
            return Ok(Usage::default());
        };
        Ok(Usage {
            cpu: cpu_time(pid)?,
            switches: context_switches(pid)?,
        })
    }

    fn side(&self) -> Side {
        Side {
            p50_us: us(percentile(&self.latencies, 0.5)),
            p99_us: us(percentile(&self.latencies, 0.99)),
            requests_per_second: self.calls as f64 / self.time.as_secs_f64().max(1e-9),
            calls: self.latencies.len() as u64 + self.calls,
            failures: self.failures,
        }
    }
}

#[derive(Clone)]
struct Target {
    http: reqwest::Client,
    url: String,
    bearer: Option<String>,
    tool: &'static str,
}

impl Target {
    async fn call(&self, n: u64) -> bool {
        let body = json!({"jsonrpc": "2.0", "id": n, "method": "tools/call",
            "params": {"name": self.tool, "arguments": {"message": "hello"}}});
        let mut request = self
            .http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .json(&body);
        if let Some(bearer) = &self.bearer {
            request = request.bearer_auth(bearer);
        }
        match request.send().await {
            Ok(response) if response.status().is_success() => response
                .bytes()
                .await
                .is_ok_and(|b| contains(&b, b"\"result\"") && !contains(&b, b"\"isError\":true")),
            _ => false,
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// User + system CPU of `pid`, from `/proc/<pid>/stat`.
fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces; fields resume after its ')'.
    let rest = &stat[stat.rfind(')').context("stat format")? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_nanos(ticks * 1_000_000_000 / per_second))
}

/// Voluntary and involuntary context switches of every thread of `pid`,
/// from `/proc/<pid>/task/*/status`.
fn context_switches(pid: u32) -> anyhow::Result<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        // A thread that ended between the listing and the read counts nothing.
        let Ok(status) = std::fs::read_to_string(task?.path().join("status")) else {
            continue;
        };
        total += status
            .lines()
            .filter(|line| line.contains("ctxt_switches:"))
            .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    Ok(total)
}

async fn prepare_store(dir: &Path, auth: bool) -> anyhow::Result<Option<String>> {
    if !auth {
        return Ok(None);
    }
    let store = Store::open_data_dir(&dir.join("data")).await?;
    let (token, bearer) = store
        .create_token(NewToken::new(
            "bench",
            [Action::Discover, Action::Call],
            ["*"],
        ))
        .await?;
    seed_001_policies(&store, &token.id).await?;
    store.close().await;
    Ok(Some(bearer))
}

pub async fn run(args: CallArgs) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (_upstream, upstream_url) = start_http_fixture(dir.path()).await?;
    let bearer = prepare_store(dir.path(), args.auth).await?;
    let config = dir.path().join("manifold.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nmode = \"direct\"\nfast_calls = {}\n\n[auth]\nrequired = {}\n\n\
             [code_mode]\nenabled = false\n\n\
             [governance]\naudit_commit = {:?}\n\n[store]\ndata_dir = \"data\"\n\n\
             [[servers]]\nname = \"bench\"\nurl = {upstream_url:?}\n",
            args.fast_calls, args.auth, args.audit_commit
        ),
    )?;
    let (_gateway, gateway_url, pid) = start_gateway(&config, "warn").await?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency.max(1) * 2)
        .build()?;
    let gateway = Arc::new(Target {
        http: http.clone(),
        url: gateway_url.clone(),
        bearer,
        tool: "bench__echo",
    });
    let direct = Arc::new(Target {
        http,
        url: upstream_url.clone(),
        bearer: None,
        tool: "echo",
    });
    // The floor: the same upstream behind nginx, when nginx is here.
    let nginx = match (args.floor, floor::find_nginx()) {
        (true, Some(nginx)) => Some(floor::start(&nginx, dir.path(), &upstream_url).await?),
        (true, None) => {
            eprintln!(
                "bench call: no nginx on PATH, so no floor row (apt-get install nginx-light)"
            );
            None
        }
        (false, _) => None,
    };
    let mut lanes = vec![
        Lane::new(Arc::clone(&direct), None),
        Lane::new(gateway, Some(pid)),
    ];
    if let Some(nginx) = &nginx {
        let hop = Arc::new(Target {
            url: nginx.url.clone(),
            ..Target::clone(&direct)
        });
        lanes.push(Lane::new(hop, nginx.pid()));
    }
    for n in 0..200 {
        for lane in &lanes {
            if !lane.target.call(n).await {
                bail!("a warm-up call to {} failed", lane.target.url);
            }
        }
    }

    // 1. Sequential, alternating blocks.
    let block = 100;
    let mut n = 0;
    let progress = Progress::new(
        "sequential calls",
        (args.iterations.div_ceil(block) * block * lanes.len()) as u64,
    );
    while lanes[0].latencies.len() < args.iterations {
        for lane in &mut lanes {
            let before = lane.usage()?;
            for _ in 0..block {
                n += 1;
                let started = Instant::now();
                lane.failures += u64::from(!lane.target.call(n).await);
                lane.latencies.push(started.elapsed());
            }
            lane.sequential.add(lane.usage()?, before);
        }
        progress.inc((block * lanes.len()) as u64);
    }
    progress.finish();

    // 2. Concurrent, alternating one-second blocks.
    let per_path = Duration::from_secs(args.seconds.max(1));
    let slice = Duration::from_secs(1).min(per_path);
    while lanes[1].time < per_path {
        for lane in &mut lanes {
            let before = lane.usage()?;
            let (calls, failed, took) = drive(&lane.target, args.concurrency, slice).await;
            lane.concurrent.add(lane.usage()?, before);
            lane.calls += calls;
            lane.failures += failed;
            lane.time += took;
        }
    }
    for lane in &mut lanes {
        lane.latencies.sort();
    }
    let direct_side = lanes[0].side();
    let gateway_side = lanes[1].side();
    let floor = lanes.get(2).map(|lane| {
        let hop = lane.side();
        Floor {
            added_p50_us: hop.p50_us - direct_side.p50_us,
            throughput_ratio: hop.requests_per_second / direct_side.requests_per_second.max(1e-9),
            cpu_us_per_call_sequential: lane.sequential.cpu_per_call(lane.latencies.len() as u64),
            cpu_us_per_call_concurrent: lane.concurrent.cpu_per_call(lane.calls),
            hop,
        }
    });
    let g = &lanes[1];
    let rss = rss_kib(pid).map_or(0.0, |kib| kib as f64 / 1024.0);
    let upstream_connections = upstream_connections(pid, &upstream_url);
    let audit_rows = count_activity_rows(dir.path()).await.unwrap_or(-1);
    let report = Report {
        auth: args.auth,
        audit_commit: args.audit_commit.clone(),
        fast_calls: args.fast_calls,
        added_p50_us: gateway_side.p50_us - direct_side.p50_us,
        throughput_ratio: gateway_side.requests_per_second
            / direct_side.requests_per_second.max(1e-9),
        cpu_us_per_call_sequential: g.sequential.cpu_per_call(g.latencies.len() as u64),
        cpu_us_per_call_concurrent: g.concurrent.cpu_per_call(g.calls),
        switches_per_call_sequential: g.sequential.switches_per_call(g.latencies.len() as u64),
        switches_per_call_concurrent: g.concurrent.switches_per_call(g.calls),
        gateway_rss_mib: rss,
        upstream_connections,
        audit_rows,
        direct: direct_side,
        gateway: gateway_side,
        floor,
    };
    print_report(&report, &args);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `callers` loops of calls for `length`: (calls, failures, elapsed).
async fn drive(target: &Arc<Target>, callers: usize, length: Duration) -> (u64, u64, Duration) {
    let started = Instant::now();
    let deadline = started + length;
    let tasks: Vec<_> = (0..callers)
        .map(|worker| {
            let target = Arc::clone(target);
            tokio::spawn(async move {
                let (mut calls, mut failed) = (0u64, 0u64);
                let mut n = (worker as u64) << 32;
                while Instant::now() < deadline {
                    n += 1;
                    calls += 1;
                    failed += u64::from(!target.call(n).await);
                }
                (calls, failed)
            })
        })
        .collect();
    let (mut calls, mut failed) = (0, 0);
    for task in tasks {
        let (c, f) = task.await.unwrap_or((0, 1));
        calls += c;
        failed += f;
    }
    (calls, failed, started.elapsed())
}

/// Established TCP connections from the gateway to the upstream's port,
/// counted from `/proc/<pid>/net/tcp` as the run ends (keep-alive keeps
/// this near the concurrency; without it, it would be zero here and the
/// kernel's TIME_WAIT list would hold thousands).
fn upstream_connections(pid: u32, upstream_url: &str) -> Option<u64> {
    let port: u16 = upstream_url
        .rsplit(':')
        .next()?
        .split('/')
        .next()?
        .parse()
        .ok()?;
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            l.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_string)
        })
        .collect();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).ok()?;
    let remote = format!(":{port:04X}");
    Some(
        table
            .lines()
            .skip(1)
            .filter(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                f.len() > 9 && f[2].ends_with(&remote) && f[3] == "01" && inodes.contains(f[9])
            })
            .count() as u64,
    )
}

async fn count_activity_rows(dir: &Path) -> anyhow::Result<i64> {
    let store = Store::open_data_dir(&dir.join("data")).await?;
    let rows = store
        .audit_export(manifold_store::AuditKind::Activity, 0)
        .await?
        .len();
    store.close().await;
    Ok(rows as i64)
}

fn print_report(r: &Report, args: &CallArgs) {
    println!(
        "tools/call side by side: separate upstream and gateway processes; auth {}; audit_commit {}; fast_calls {}",
        if r.auth {
            "on (token, 373 policies)"
        } else {
            "off"
        },
        r.audit_commit,
        if r.fast_calls { "on" } else { "off" }
    );
    println!(
        "{:<28} {:>10} {:>10} {:>12} {:>9}",
        "path", "p50 µs", "p99 µs", "req/s", "failures"
    );
    let floor = r
        .floor
        .as_ref()
        .map(|f| ("through nginx (the floor)", &f.hop));
    for (name, s) in [
        ("straight to the upstream", &r.direct),
        ("through Manifold", &r.gateway),
    ]
    .into_iter()
    .chain(floor)
    {
        println!(
            "{:<28} {:>10.0} {:>10.0} {:>12.0} {:>9}",
            name, s.p50_us, s.p99_us, s.requests_per_second, s.failures
        );
    }
    println!(
        "added p50: {:.0} µs ({} sequential calls per path)",
        r.added_p50_us, args.iterations
    );
    println!(
        "throughput with {} callers: {:.2}× direct",
        args.concurrency, r.throughput_ratio
    );
    println!(
        "gateway CPU per call: {:.0} µs sequential, {:.0} µs with {} callers",
        r.cpu_us_per_call_sequential, r.cpu_us_per_call_concurrent, args.concurrency
    );
    println!(
        "gateway context switches per call: {:.1} sequential, {:.2} with {} callers",
        r.switches_per_call_sequential, r.switches_per_call_concurrent, args.concurrency
    );
    if let Some(f) = &r.floor {
        println!(
            "nginx as a plain hop, the floor here: added p50 {:.0} µs; {:.2}× direct with {} callers; CPU per call {:.0} µs sequential, {:.0} µs with {} callers",
            f.added_p50_us,
            f.throughput_ratio,
            args.concurrency,
            f.cpu_us_per_call_sequential,
            f.cpu_us_per_call_concurrent,
            args.concurrency
        );
    }
    println!(
        "gateway RSS {:.1} MiB; gateway→upstream connections open at the end: {}; activity rows: {}",
        r.gateway_rss_mib,
        r.upstream_connections
            .map_or("unknown".to_string(), |c| c.to_string()),
        r.audit_rows
    );
}
