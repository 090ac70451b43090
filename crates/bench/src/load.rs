//! `manifold-bench load`: a real `manifold serve` child in front of two HTTP
//! fixture upstreams, driven over loopback with raw JSON-RPC, in bounded
//! phases. It reports figures (and writes them as JSON); the load test in
//! `crates/manifold/tests/e2e/load.rs` asserts on that JSON.
//!
//! 1. below capacity: `tools/call` through the gateway and straight to the
//!    upstream, alternating in blocks, plus a cached listing now and then;
//! 2. above capacity: many callers list a slow private server at once, so
//!    admission control must refuse some with 503 `tool_discovery_busy`;
//! 3. soak (optional): steady mixed traffic with the gateway's RSS sampled.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use serde::Serialize;
use serde_json::{Value, json};

use crate::{
    processes::{rss_kib, start_gateway, start_http_fixture_with},
    stats::{percentile, us},
};

#[derive(clap::Args)]
pub struct LoadArgs {
    /// Length of the below-capacity phase (split evenly between the
    /// gateway and the direct path) and of the overload phase.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Concurrent callers below capacity.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Concurrent listing callers above capacity (admission: 2 active, 8 queued).
    #[arg(long, default_value_t = 64)]
    pub overload: usize,
    /// Soak length; 0 skips the soak.
    #[arg(long, default_value_t = 0)]
    pub soak_seconds: u64,
    /// RSS sampling interval during the soak.
    #[arg(long, default_value_t = 5000)]
    pub sample_ms: u64,
    /// Also write the figures here as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Default, Serialize)]
struct Phase {
    requests: u64,
    ok: u64,
    /// 503 with `tool_discovery_busy` and `Retry-After`.
    busy: u64,
    /// Anything else: a transport error, another status, a JSON-RPC error.
    other: u64,
    seconds: f64,
    requests_per_second: f64,
    p50_us: f64,
    p99_us: f64,
    /// The first few "other" failures, for the report.
    failures: Vec<String>,
}

#[derive(Serialize)]
struct Soak {
    phase: Phase,
    /// (seconds since the soak began, gateway RSS in KiB)
    rss_kib: Vec<(f64, u64)>,
    /// Mean RSS of the last quarter over the mean of the second quarter.
    growth: f64,
}

#[derive(Serialize)]
struct Report {
    gateway: Phase,
    direct: Phase,
    overload: Phase,
    soak: Option<Soak>,
}

/// One JSON-RPC exchange's outcome.
enum Outcome {
    Ok,
    Busy,
    Other(String),
}

struct Target {
    http: reqwest::Client,
    url: String,
}

impl Target {
    /// Sends one stateless request; `who` becomes the bearer, which names the
    /// caller (auth is off), so private listings are per caller.
    async fn send(&self, body: &Value, who: Option<&str>) -> Outcome {
        let mut request = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .json(body);
        if let Some(who) = who {
            request = request.bearer_auth(who);
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => return Outcome::Other(format!("transport: {e}")),
        };
        let status = response.status().as_u16();
        let retry_after = response.headers().contains_key("retry-after");
        let text = response.text().await.unwrap_or_default();
        match status {
            503 if retry_after && text.contains(manifold_server::BUSY_CODE) => Outcome::Busy,
            200 if text.contains("\"result\"") && !text.contains("\"isError\":true") => Outcome::Ok,
            _ => Outcome::Other(format!(
                "{status}: {}",
                text.chars().take(200).collect::<String>()
            )),
        }
    }
}

#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    ok: u64,
    busy: u64,
    other: u64,
    failures: Vec<String>,
}

impl Tally {
    fn add(&mut self, outcome: Outcome, took: Duration) {
        self.latencies.push(took);
        match outcome {
            Outcome::Ok => self.ok += 1,
            Outcome::Busy => self.busy += 1,
            Outcome::Other(why) => {
                self.other += 1;
                if self.failures.len() < 5 {
                    self.failures.push(why);
                }
            }
        }
    }

    fn merge(&mut self, other: Tally) {
        self.latencies.extend(other.latencies);
        self.ok += other.ok;
        self.busy += other.busy;
        self.other += other.other;
        for f in other.failures {
            if self.failures.len() < 5 {
                self.failures.push(f);
            }
        }
    }

    fn phase(mut self, elapsed: Duration) -> Phase {
        self.latencies.sort();
        let requests = self.latencies.len() as u64;
        Phase {
            requests,
            ok: self.ok,
            busy: self.busy,
            other: self.other,
            seconds: elapsed.as_secs_f64(),
            requests_per_second: requests as f64 / elapsed.as_secs_f64().max(1e-9),
            p50_us: us(percentile(&self.latencies, 0.5)),
            p99_us: us(percentile(&self.latencies, 0.99)),
            failures: self.failures,
        }
    }
}

fn call_body(tool: &str, n: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": n, "method": "tools/call",
           "params": {"name": tool, "arguments": {"message": format!("load {n}")}}})
}

fn list_body(n: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": n, "method": "tools/list", "params": {}})
}

/// `workers` loops of `step` until `deadline`; the tallies merged.
async fn drive<F, Fut>(workers: usize, deadline: Instant, step: F) -> Tally
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Outcome> + Send,
{
    let mut tasks = Vec::new();
    for worker in 0..workers {
        let step = step.clone();
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let mut n = 0;
            while Instant::now() < deadline {
                n += 1;
                let started = Instant::now();
                let outcome = step(worker, n).await;
                tally.add(outcome, started.elapsed());
            }
            tally
        }));
    }
    let mut total = Tally::default();
    for task in tasks {
        total.merge(task.await.expect("load worker"));
    }
    total
}

pub async fn run(args: LoadArgs) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (_fast, fast_url) = start_http_fixture_with(dir.path(), &[]).await?;
    let slow_dir = dir.path().join("slow");
    std::fs::create_dir_all(&slow_dir)?;
    let (_slow, slow_url) = start_http_fixture_with(
        &slow_dir,
        &["--cache-scope", "private", "--list-delay-ms", "200"],
    )
    .await?;
    // Two gateways: one in front of the fast server for calls and the soak,
    // one in front of the slow private server for the overload.
    let write_config = |name: &str, url: &str| -> anyhow::Result<PathBuf> {
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &path,
            format!(
                "[gateway]\nmode = \"direct\"\n\n[admission]\nmax_active = 2\nmax_queued = 8\n\n\
                 [code_mode]\nenabled = false\n\n[store]\ndata_dir = \"{name}-data\"\n\n\
                 [[servers]]\nname = \"{name}\"\nurl = {url:?}\n"
            ),
        )?;
        Ok(path)
    };
    let (_gateway, gateway_url, pid) =
        start_gateway(&write_config("fast", &fast_url)?, "warn").await?;
    let (_crowded, crowded_url, _) =
        start_gateway(&write_config("slow", &slow_url)?, "warn").await?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.overload.max(args.concurrency))
        .build()?;
    let gateway = Arc::new(Target {
        http: http.clone(),
        url: gateway_url,
    });
    let crowded = Arc::new(Target {
        http: http.clone(),
        url: crowded_url,
    });
    let direct = Arc::new(Target {
        http,
        url: fast_url,
    });
    // Warm the listings so that phase 1 measures calls, not first fetches.
    gateway.send(&list_body(0), Some("warm")).await;

    // Phase 1: alternate one-second blocks between the two paths so that a
    // noisy neighbour hits both alike.
    let half = Duration::from_secs(args.seconds.max(2)) / 2;
    let (mut via, mut straight) = (Tally::default(), Tally::default());
    let (mut via_time, mut straight_time) = (Duration::ZERO, Duration::ZERO);
    let block = Duration::from_secs(1).min(half);
    while via_time < half {
        let started = Instant::now();
        let target = Arc::clone(&gateway);
        via.merge(
            drive(args.concurrency, started + block, move |worker, n| {
                let target = Arc::clone(&target);
                async move {
                    if n % 10 == 0 {
                        // A listing now and then, cached per caller.
                        target
                            .send(&list_body(n), Some(&format!("caller-{worker}")))
                            .await
                    } else {
                        target.send(&call_body("fast__echo", n), None).await
                    }
                }
            })
            .await,
        );
        via_time += started.elapsed();
        let started = Instant::now();
        let target = Arc::clone(&direct);
        straight.merge(
            drive(args.concurrency, started + block, move |_, n| {
                let target = Arc::clone(&target);
                async move {
                    if n % 10 == 0 {
                        target.send(&list_body(n), None).await
                    } else {
                        target.send(&call_body("echo", n), None).await
                    }
                }
            })
            .await,
        );
        straight_time += started.elapsed();
    }

    // Phase 2: every caller lists the slow private server at once.
    let started = Instant::now();
    let target = Arc::clone(&crowded);
    let unique = Arc::new(AtomicU64::new(0));
    let overload = drive(
        args.overload,
        started + Duration::from_secs(args.seconds.max(1)),
        move |_, n| {
            let target = Arc::clone(&target);
            let who = format!("crowd-{}", unique.fetch_add(1, Ordering::Relaxed));
            async move { target.send(&list_body(n), Some(&who)).await }
        },
    )
    .await
    .phase(started.elapsed());

    let soak = if args.soak_seconds > 0 {
        let started = Instant::now();
        let deadline = started + Duration::from_secs(args.soak_seconds);
        let done = Arc::new(AtomicBool::new(false));
        let sampler = {
            let done = Arc::clone(&done);
            let every = Duration::from_millis(args.sample_ms.max(100));
            tokio::spawn(async move {
                let mut samples = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    if let Some(kib) = rss_kib(pid) {
                        samples.push((started.elapsed().as_secs_f64(), kib));
                    }
                    tokio::time::sleep(every).await;
                }
                samples
            })
        };
        let target = Arc::clone(&gateway);
        let tally = drive(args.concurrency.div_ceil(2), deadline, move |worker, n| {
            let target = Arc::clone(&target);
            async move {
                // Calls, cached listings, and now and then a new caller's
                // listing (a new cache entry, which must be bounded).
                match n % 20 {
                    0 => {
                        target
                            .send(&list_body(n), Some(&format!("soak-{worker}-{n}")))
                            .await
                    }
                    1..=3 => {
                        target
                            .send(&list_body(n), Some(&format!("caller-{worker}")))
                            .await
                    }
                    _ => target.send(&call_body("fast__echo", n), None).await,
                }
            }
        })
        .await;
        done.store(true, Ordering::Relaxed);
        let rss_kib = sampler.await.expect("sampler");
        let quarter = (rss_kib.len() / 4).max(1);
        let mean = |s: &[(f64, u64)]| {
            s.iter().map(|(_, k)| *k as f64).sum::<f64>() / s.len().max(1) as f64
        };
        let second = mean(&rss_kib[quarter.min(rss_kib.len())..(2 * quarter).min(rss_kib.len())]);
        let last = mean(&rss_kib[rss_kib.len().saturating_sub(quarter)..]);
        Some(Soak {
            phase: tally.phase(started.elapsed()),
            growth: if second > 0.0 { last / second } else { 0.0 },
            rss_kib,
        })
    } else {
        None
    };

    let report = Report {
        gateway: via.phase(via_time),
        direct: straight.phase(straight_time),
        overload,
        soak,
    };
    print_report(&report, &args);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn print_report(r: &Report, args: &LoadArgs) {
    println!(
        "load on loopback: {} callers below capacity, {} above (admission 2 active + 8 queued)",
        args.concurrency, args.overload
    );
    println!(
        "{:<26} {:>9} {:>9} {:>7} {:>7} {:>10} {:>10}",
        "phase", "requests", "req/s", "busy", "other", "p50 µs", "p99 µs"
    );
    let row = |name: &str, p: &Phase| {
        println!(
            "{:<26} {:>9} {:>9.0} {:>7} {:>7} {:>10.0} {:>10.0}",
            name, p.requests, p.requests_per_second, p.busy, p.other, p.p50_us, p.p99_us
        );
        for f in &p.failures {
            println!("    failure: {f}");
        }
    };
    row("through Manifold", &r.gateway);
    row("straight to the upstream", &r.direct);
    row("overload (listings)", &r.overload);
    if let Some(soak) = &r.soak {
        row("soak", &soak.phase);
    }
    println!(
        "ratio (Manifold / direct): throughput {:.2}×, p50 {:.2}×, p99 {:.2}×",
        r.gateway.requests_per_second / r.direct.requests_per_second.max(1e-9),
        r.gateway.p50_us / r.direct.p50_us.max(1e-9),
        r.gateway.p99_us / r.direct.p99_us.max(1e-9)
    );
    if let Some(soak) = &r.soak {
        let first = soak.rss_kib.first().map_or(0, |s| s.1);
        let max = soak.rss_kib.iter().map(|s| s.1).max().unwrap_or(0);
        let last = soak.rss_kib.last().map_or(0, |s| s.1);
        println!(
            "soak RSS: first {:.1} MiB, max {:.1} MiB, last {:.1} MiB over {} samples; last quarter / second quarter = {:.3}",
            first as f64 / 1024.0,
            max as f64 / 1024.0,
            last as f64 / 1024.0,
            soak.rss_kib.len(),
            soak.growth
        );
    }
}
