//! The gateway's side of the sandbox: a pool of pre-started workers, and
//! the loop that serves one run. The loop is where the limits the script
//! must not be able to touch live: the call cap, call concurrency, the
//! output cap and the deadline after which a worker is killed.

use std::{
    collections::{HashMap, VecDeque},
    fs::File,
    os::{fd::OwnedFd, unix::process::ExitStatusExt},
    path::PathBuf,
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, future::BoxFuture, stream::FuturesUnordered};
use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, Lines},
    process::{Child, Command},
    sync::Semaphore,
};

use crate::{
    engine::{Binding, EngineLimits, Reply, RunReport, Stream},
    protocol::{FromWorker, ToWorker},
    worker,
};

/// Where scripts run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    /// Pre-started worker processes, isolated from the gateway.
    #[default]
    Process,
    /// A thread of the gateway: no process isolation, for measurement and
    /// for platforms that cannot isolate. The gateway warns loudly.
    InProcess,
}

#[derive(Debug, Clone)]
pub struct SandboxConfig {
    pub mode: SandboxMode,
    /// Workers kept started; also the number of scripts running at once.
    pub workers: usize,
    /// The worker command (the gateway binary and its hidden subcommand).
    pub program: PathBuf,
    pub args: Vec<String>,
    pub limits: RunLimits,
    pub admission: RunAdmission,
}

/// Who may wait for a worker, and how long: one caller cannot hold every
/// worker, and a burst waits in a bounded queue, not without end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAdmission {
    /// Runs that may wait for a worker at once; the next is refused.
    pub max_queued: usize,
    /// Runs one principal may have running or waiting at once.
    pub max_runs_per_principal: usize,
    /// How long a run waits for a worker before it is refused.
    pub queue_timeout: Duration,
}

impl Default for RunAdmission {
    fn default() -> Self {
        RunAdmission {
            max_queued: 16,
            max_runs_per_principal: 2,
            queue_timeout: Duration::from_secs(30),
        }
    }
}

/// Per-run limits; the engine's part travels to the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunLimits {
    pub engine: EngineLimits,
    pub max_calls: u64,
    pub max_concurrent_calls: usize,
    /// Log text returned to the model; the rest is cut with a marker.
    pub max_output_bytes: usize,
    /// How long past the wall deadline a silent worker is given before it is
    /// killed.
    pub kill_grace: Duration,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            engine: EngineLimits::default(),
            max_calls: 50,
            max_concurrent_calls: 8,
            max_output_bytes: 16 << 10,
            kill_grace: Duration::from_secs(2),
        }
    }
}

/// Answers the script's tool calls. Each answer is the `ok`/`value` of a
/// [`Reply`].
pub trait ToolCalls: Send + Sync {
    fn call(&self, tool: String, args: Json) -> BoxFuture<'static, (bool, Json)>;
}

/// How a run ended, seen from the gateway.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RunEnd {
    /// The engine reported; see its `ending`.
    Engine(Box<RunReport>),
    /// The worker died mid-run (crash, abort, kill); it was replaced.
    WorkerLost { reason: String },
    /// The worker stayed silent past the wall deadline and was killed.
    Unresponsive,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunOutput {
    pub end: RunEnd,
    /// What the script logged, in order, up to the output cap.
    pub logs: Vec<(Stream, String)>,
    /// Bytes of log text cut by the output cap (gateway and worker side).
    pub truncated_bytes: u64,
    /// Calls the script made, and how many the gateway refused for the cap.
    pub calls: u64,
    pub calls_over_cap: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("could not start a sandbox worker: {0}")]
    Spawn(std::io::Error),
    #[error("a sandbox worker did not start: {0}")]
    Handshake(String),
    /// Refused for capacity; nothing ran. Try again after `retry_after`.
    #[error("{reason}")]
    Busy {
        reason: String,
        retry_after: Duration,
    },
}

/// The worker pool.
pub struct Sandbox {
    config: SandboxConfig,
    idle: Mutex<Vec<Link>>,
    slots: Semaphore,
    /// Runs waiting for a slot.
    waiting: AtomicUsize,
    /// Runs running or waiting, per principal.
    per_principal: Mutex<HashMap<String, usize>>,
    isolation: Mutex<Json>,
    replaced: AtomicU64,
}

impl Sandbox {
    /// Starts `config.workers` workers and waits for each to report ready.
    pub async fn start(config: SandboxConfig) -> Result<Arc<Self>, SandboxError> {
        let workers = config.workers.max(1);
        let sandbox = Arc::new(Sandbox {
            slots: Semaphore::new(workers),
            waiting: AtomicUsize::new(0),
            per_principal: Mutex::new(HashMap::new()),
            idle: Mutex::new(Vec::new()),
            isolation: Mutex::new(Json::Null),
            replaced: AtomicU64::new(0),
            config,
        });
        for _ in 0..workers {
            let link = sandbox.spawn().await?;
            sandbox.lock_idle().push(link);
        }
        Ok(sandbox)
    }

    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// What the latest worker reported about its isolation.
    pub fn isolation(&self) -> Json {
        self.isolation
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Workers replaced after dying or being killed.
    pub fn replaced(&self) -> u64 {
        self.replaced.load(Ordering::Relaxed)
    }

    /// Process ids of the idle workers (for operators and tests).
    pub fn worker_pids(&self) -> Vec<u32> {
        self.lock_idle().iter().filter_map(|l| l.pid).collect()
    }

    /// Runs `code` (JavaScript) for `principal` on a worker, answering its
    /// calls with `tools`. Waits for a free worker within the admission
    /// bounds, or is refused with [`SandboxError::Busy`].
    pub async fn run(
        &self,
        principal: &str,
        code: String,
        bindings: Vec<Binding>,
        limits: RunLimits,
        tools: Arc<dyn ToolCalls>,
    ) -> Result<RunOutput, SandboxError> {
        let admission = self.config.admission;
        let _mine = self.count_run(principal)?;
        let _slot = match self.slots.try_acquire() {
            Ok(slot) => slot,
            Err(_) => {
                let _queued = self.enqueue()?;
                match tokio::time::timeout(admission.queue_timeout, self.slots.acquire()).await {
                    Ok(slot) => slot.expect("the pool is never closed"),
                    Err(_) => {
                        return Err(SandboxError::Busy {
                            reason: format!(
                                "no sandbox worker came free within {} ms (code_mode.queue_timeout_ms)",
                                admission.queue_timeout.as_millis()
                            ),
                            retry_after: Duration::from_secs(1),
                        });
                    }
                }
            }
        };
        let link = self.lock_idle().pop();
        let mut link = match link {
            Some(link) => link,
            None => self.spawn().await?,
        };
        let (output, healthy) = serve_run(&mut link, code, bindings, limits, tools).await;
        if healthy {
            self.lock_idle().push(link);
        } else {
            self.replaced.fetch_add(1, Ordering::Relaxed);
            link.kill().await;
            // The replacement starts now, so the next run need not wait for it.
            match self.spawn().await {
                Ok(fresh) => self.lock_idle().push(fresh),
                Err(error) => tracing::error!(%error, "could not replace a sandbox worker"),
            }
        }
        Ok(output)
    }

    /// Counts a run against its principal's cap until the guard drops.
    fn count_run(&self, principal: &str) -> Result<RunGuard<'_>, SandboxError> {
        let cap = self.config.admission.max_runs_per_principal.max(1);
        let mut counts = self.per_principal.lock().unwrap_or_else(|p| p.into_inner());
        let count = counts.entry(principal.to_string()).or_default();
        if *count >= cap {
            return Err(SandboxError::Busy {
                reason: format!(
                    "this caller already has {count} code-mode runs going, the most one caller may have (code_mode.max_runs_per_principal = {cap})"
                ),
                retry_after: Duration::from_secs(1),
            });
        }
        *count += 1;
        Ok(RunGuard::Principal(self, principal.to_string()))
    }

    /// Takes a place in the queue until the guard drops.
    fn enqueue(&self) -> Result<RunGuard<'_>, SandboxError> {
        let max = self.config.admission.max_queued;
        let before = self.waiting.fetch_add(1, Ordering::SeqCst);
        if before >= max {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(SandboxError::Busy {
                reason: format!(
                    "every sandbox worker is busy and {max} runs are already waiting (code_mode.max_queued)"
                ),
                retry_after: Duration::from_secs(1),
            });
        }
        Ok(RunGuard::Queued(self))
    }

    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Vec<Link>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn spawn(&self) -> Result<Link, SandboxError> {
        let mut link = match self.config.mode {
            SandboxMode::Process => Link::process(&self.config)?,
            SandboxMode::InProcess => Link::thread()?,
        };
        let ready = tokio::time::timeout(Duration::from_secs(10), link.lines.next_line()).await;
        let line = match ready {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) => {
                let reason = link.exit_reason().await;
                return Err(SandboxError::Handshake(reason));
            }
            Ok(Err(error)) => return Err(SandboxError::Handshake(error.to_string())),
            Err(_) => {
                link.kill().await;
                return Err(SandboxError::Handshake("no answer within 10 s".into()));
            }
        };
        match serde_json::from_str(&line) {
            Ok(FromWorker::Ready { isolation }) => {
                *self.isolation.lock().unwrap_or_else(|p| p.into_inner()) = isolation;
                Ok(link)
            }
            _ => Err(SandboxError::Handshake(format!(
                "unexpected first message: {line}"
            ))),
        }
    }
}

/// Releases what [`Sandbox::count_run`] or [`Sandbox::enqueue`] took, on
/// every path out of a run (a refusal, a panic, a dropped future).
enum RunGuard<'a> {
    Principal(&'a Sandbox, String),
    Queued(&'a Sandbox),
}

impl Drop for RunGuard<'_> {
    fn drop(&mut self) {
        match self {
            RunGuard::Principal(sandbox, principal) => {
                let mut counts = sandbox
                    .per_principal
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if let Some(count) = counts.get_mut(principal.as_str()) {
                    *count -= 1;
                    if *count == 0 {
                        counts.remove(principal.as_str());
                    }
                }
            }
            RunGuard::Queued(sandbox) => {
                sandbox.waiting.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// Serves one run; false when the worker must be replaced.
async fn serve_run(
    link: &mut Link,
    code: String,
    bindings: Vec<Binding>,
    limits: RunLimits,
    tools: Arc<dyn ToolCalls>,
) -> (RunOutput, bool) {
    let mut output = Output::new(limits.max_output_bytes);
    let mut calls = 0u64;
    let mut over_cap = 0u64;
    let finish = |end, output: Output, calls, over_cap| RunOutput {
        end,
        truncated_bytes: output.truncated,
        logs: output.logs,
        calls,
        calls_over_cap: over_cap,
    };
    let request = ToWorker::Run {
        code,
        bindings,
        limits: limits.engine,
    };
    if let Err(error) = link.send(&request).await {
        let reason = format!("{error}; {}", link.exit_reason().await);
        return (finish(RunEnd::WorkerLost { reason }, output, 0, 0), false);
    }
    let deadline = tokio::time::Instant::now()
        + Duration::from_millis(limits.engine.wall_ms)
        + limits.kill_grace;
    let mut in_flight = FuturesUnordered::new();
    let mut waiting: VecDeque<(u64, String, Json)> = VecDeque::new();
    let start = |id: u64, tool: String, args: Json| {
        let call = tools.call(tool, args);
        async move { (id, call.await) }
    };
    loop {
        tokio::select! {
            line = link.lines.next_line() => {
                let line = match line {
                    Ok(Some(line)) => line,
                    Ok(None) | Err(_) => {
                        let reason = link.exit_reason().await;
                        return (finish(RunEnd::WorkerLost { reason }, output, calls, over_cap), false);
                    }
                };
                match serde_json::from_str::<FromWorker>(&line) {
                    Ok(FromWorker::Call { id, tool, args }) => {
                        calls += 1;
                        if calls > limits.max_calls {
                            over_cap += 1;
                            let refusal = json!({
                                "code": "call_limit",
                                "message": format!("this run may make at most {} tool calls", limits.max_calls),
                                "tool": tool,
                            });
                            let reply = ToWorker::Reply(Reply { id, ok: false, value: refusal });
                            if link.send(&reply).await.is_err() {
                                continue;
                            }
                        } else if in_flight.len() < limits.max_concurrent_calls.max(1) {
                            in_flight.push(start(id, tool, args));
                        } else {
                            waiting.push_back((id, tool, args));
                        }
                    }
                    Ok(FromWorker::Log { stream, text }) => output.push(stream, text),
                    Ok(FromWorker::Done { mut report }) => {
                        output.truncated += report.log_bytes_dropped;
                        report.calls = calls;
                        // Calls the script started but did not await still
                        // run to their end (within the deadline), so what
                        // happened upstream never depends on timing.
                        let drained = tokio::time::timeout_at(deadline, async {
                            while in_flight.next().await.is_some() {
                                if let Some((id, tool, args)) = waiting.pop_front() {
                                    in_flight.push(start(id, tool, args));
                                }
                            }
                        })
                        .await;
                        if drained.is_err() {
                            tracing::warn!("calls a finished script left running passed the deadline; dropped");
                        }
                        return (finish(RunEnd::Engine(Box::new(report)), output, calls, over_cap), true);
                    }
                    Ok(FromWorker::Ready { .. }) | Err(_) => {
                        let reason = format!("the worker sent something unexpected: {}", truncate(&line, 200));
                        return (finish(RunEnd::WorkerLost { reason }, output, calls, over_cap), false);
                    }
                }
            }
            Some((id, (ok, value))) = in_flight.next(), if !in_flight.is_empty() => {
                if let Some((id, tool, args)) = waiting.pop_front() {
                    in_flight.push(start(id, tool, args));
                }
                // A failed write shows up as the worker's end on the next read.
                let _ = link.send(&ToWorker::Reply(Reply { id, ok, value })).await;
            }
            () = tokio::time::sleep_until(deadline) => {
                return (finish(RunEnd::Unresponsive, output, calls, over_cap), false);
            }
        }
    }
}

/// Logs kept for the model, cut at a byte budget.
struct Output {
    logs: Vec<(Stream, String)>,
    budget: usize,
    truncated: u64,
}

impl Output {
    fn new(budget: usize) -> Self {
        Output {
            logs: Vec::new(),
            budget,
            truncated: 0,
        }
    }

    fn push(&mut self, stream: Stream, text: String) {
        let size = text.len() + 1;
        if size <= self.budget {
            self.budget -= size;
            self.logs.push((stream, text));
            return;
        }
        if self.budget > 0 {
            let kept = truncate(&text, self.budget.saturating_sub(1)).to_string();
            self.truncated += (text.len() - kept.len()) as u64;
            self.budget = 0;
            self.logs.push((stream, kept));
        } else {
            self.truncated += size as u64;
        }
    }
}

fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// One worker: its pipe, and the process or thread behind it.
struct Link {
    writer: Box<dyn AsyncWrite + Unpin + Send>,
    lines: Lines<BufReader<Box<dyn AsyncRead + Unpin + Send>>>,
    child: Option<Child>,
    pid: Option<u32>,
    stderr: Arc<Mutex<String>>,
}

impl Link {
    fn process(config: &SandboxConfig) -> Result<Link, SandboxError> {
        let mut child = Command::new(&config.program)
            .args(&config.args)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(SandboxError::Spawn)?;
        let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let (Some(stdin), Some(stdout), Some(mut stderr)) = pipes else {
            return Err(SandboxError::Handshake(
                "the worker's pipes were not set up".into(),
            ));
        };
        // The tail of stderr says why a worker died (a panic message, say).
        let tail = Arc::new(Mutex::new(String::new()));
        {
            let tail = Arc::clone(&tail);
            tokio::spawn(async move {
                let mut buffer = [0u8; 1024];
                while let Ok(n @ 1..) = stderr.read(&mut buffer).await {
                    let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
                    tail.push_str(&String::from_utf8_lossy(&buffer[..n]));
                    if tail.len() > 2048 {
                        let cut = tail.len() - 2048;
                        let cut = (cut..tail.len())
                            .find(|&i| tail.is_char_boundary(i))
                            .unwrap_or(0);
                        tail.drain(..cut);
                    }
                }
            });
        }
        Ok(Link {
            pid: child.id(),
            writer: Box::new(stdin),
            lines: BufReader::new(Box::new(stdout) as Box<dyn AsyncRead + Unpin + Send>).lines(),
            child: Some(child),
            stderr: tail,
        })
    }

    /// A worker on a thread of this process, over a socket pair so the
    /// protocol is the same.
    fn thread() -> Result<Link, SandboxError> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(SandboxError::Spawn)?;
        let writer = theirs.try_clone().map_err(SandboxError::Spawn)?;
        std::thread::Builder::new()
            .name("sandbox-in-process".into())
            .stack_size(8 << 20)
            .spawn(move || {
                let input = File::from(OwnedFd::from(theirs));
                let ready = json!({ "mode": "in_process", "layers": [] });
                if let Err(error) = worker::serve(input, writer, ready) {
                    tracing::debug!(%error, "in-process sandbox worker ended");
                }
            })
            .map_err(SandboxError::Spawn)?;
        ours.set_nonblocking(true).map_err(SandboxError::Spawn)?;
        let stream = tokio::net::UnixStream::from_std(ours).map_err(SandboxError::Spawn)?;
        let (read, write) = stream.into_split();
        Ok(Link {
            writer: Box::new(write),
            lines: BufReader::new(Box::new(read) as Box<dyn AsyncRead + Unpin + Send>).lines(),
            child: None,
            pid: None,
            stderr: Arc::default(),
        })
    }

    async fn send(&mut self, message: &ToWorker) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(message)?;
        line.push(b'\n');
        self.writer.write_all(&line).await?;
        self.writer.flush().await
    }

    async fn kill(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
        // A thread worker ends when its socket closes, with the link.
    }

    /// Why the worker went away, as precisely as the OS says.
    async fn exit_reason(&mut self) -> String {
        let Some(child) = &mut self.child else {
            return "the in-process worker stopped".into();
        };
        let status = match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(error)) => return format!("the worker's status is unknown: {error}"),
            Err(_) => {
                let _ = child.start_kill();
                return "the worker closed its pipe but did not exit; killed".into();
            }
        };
        let mut reason = match (status.code(), status.signal()) {
            (_, Some(signal)) => format!(
                "the worker was killed by signal {signal} ({})",
                signal_name(signal)
            ),
            (Some(code), None) => format!("the worker exited with code {code}"),
            (None, None) => "the worker ended".into(),
        };
        let tail = self
            .stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .trim()
            .to_string();
        if !tail.is_empty() {
            reason.push_str(": ");
            reason.push_str(truncate(&tail, 1024));
        }
        reason
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGKILL => "SIGKILL",
        libc::SIGABRT => "SIGABRT, an abort",
        libc::SIGSEGV => "SIGSEGV, a memory fault",
        libc::SIGSYS => "SIGSYS, a system call outside the sandbox's allow-list",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU, the CPU rlimit",
        _ => "another signal",
    }
}
