//! The QuickJS side of a run: one fresh runtime per script, the prelude
//! that turns stub calls into host requests, and the loop that alternates
//! between running JavaScript and waiting for the host's answers.
//!
//! The engine knows nothing about pipes or brokers: it talks to a [`Host`].
//! The worker process implements it over stdin/stdout; benchmarks and tests
//! implement it in process.

use std::{
    cell::{Cell, RefCell},
    rc::Rc,
    sync::OnceLock,
    time::{Duration, Instant},
};

use rquickjs::{
    Context, Ctx, Function, Module, Runtime, Value, WriteOptions,
    allocator::{Allocator, RustAllocator},
};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

/// What the engine enforces itself. Call caps, call concurrency and output
/// size are enforced by the host, which the script cannot reach.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct EngineLimits {
    /// CPU time of the script's thread, checked by the interrupt handler.
    pub cpu_ms: u64,
    /// From the start of the run, awaiting included.
    pub wall_ms: u64,
    /// The QuickJS heap.
    pub memory_bytes: usize,
    /// Log text sent to the host; the rest is counted, not sent.
    pub log_bytes: usize,
}

impl Default for EngineLimits {
    fn default() -> Self {
        EngineLimits {
            cpu_ms: 5_000,
            wall_ms: 30_000,
            memory_bytes: 64 << 20,
            log_bytes: 64 << 10,
        }
    }
}

/// How the script reaches a tool: `<namespace>.<function>(input)` calls
/// `tool`; `structured` stubs resolve to the `structuredContent`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Binding {
    pub namespace: String,
    pub function: String,
    pub tool: String,
    pub structured: bool,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Out,
    Err,
}

/// The host's answer to one call. `ok: false` makes the stub throw a
/// `ToolError` built from `value` (`message`, `server`, `tool`, `content`,
/// `code`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Reply {
    pub id: u64,
    pub ok: bool,
    pub value: Json,
}

/// The engine's view of whoever runs the tools.
pub trait Host {
    fn call(&mut self, id: u64, tool: &str, args: Json);
    fn log(&mut self, stream: Stream, text: &str);
    /// The next reply, or `None` once `deadline` passes.
    fn next_reply(&mut self, deadline: Instant) -> Option<Reply>;
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// The script finished; its value, if any, is in `value`.
    Completed,
    /// An uncaught error or rejection; see `error`.
    Threw,
    CpuDeadline,
    WallDeadline,
    MemoryLimit,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ScriptError {
    pub name: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<String>,
    /// Set for a `ToolError`: `server`, `tool`, `content`, `code`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_error: Option<Json>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunReport {
    pub ending: Ending,
    /// The script's returned value, as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Json>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ScriptError>,
    pub calls: u64,
    /// Log bytes the engine did not send because of `log_bytes`.
    pub log_bytes_dropped: u64,
    pub cpu_us: u64,
}

const PRELUDE: &str = include_str!("prelude.js");

/// Runs one script (plain JavaScript; strip TypeScript first) to its end.
/// The script is the body of an async function: it may `await` and
/// `return` at the top level.
pub fn run(
    code: &str,
    bindings: &[Binding],
    limits: &EngineLimits,
    host: &mut dyn Host,
) -> RunReport {
    let started_cpu = thread_cpu();
    let wall_deadline = Instant::now() + Duration::from_millis(limits.wall_ms);
    let cpu_deadline = started_cpu + Duration::from_millis(limits.cpu_ms);
    let stop: Rc<Cell<Option<Ending>>> = Rc::default();
    let report = |ending, value, error, outbox: &Outbox| RunReport {
        ending,
        value,
        error,
        calls: outbox.next_id.get(),
        log_bytes_dropped: outbox.dropped.get(),
        cpu_us: (thread_cpu().saturating_sub(started_cpu)).as_micros() as u64,
    };
    let outbox = Rc::new(Outbox::new(limits.log_bytes));
    let memory = Rc::new(MemoryMeter {
        limit: limits.memory_bytes,
        used: Cell::new(0),
        refused: Cell::new(false),
    });
    let (runtime, context) = match new_context(&memory) {
        Ok(pair) => pair,
        Err(error) => {
            let error = ScriptError {
                name: "InternalError".into(),
                message: format!("could not start the JavaScript engine: {error}"),
                stack: None,
                tool_error: None,
            };
            return report(Ending::Threw, None, Some(error), &outbox);
        }
    };
    {
        let stop = Rc::clone(&stop);
        runtime.set_interrupt_handler(Some(Box::new(move || {
            if stop.get().is_some() {
                return true;
            }
            let ending = if thread_cpu() > cpu_deadline {
                Ending::CpuDeadline
            } else if Instant::now() > wall_deadline {
                Ending::WallDeadline
            } else {
                return false;
            };
            stop.set(Some(ending));
            true
        })));
    }
    context.with(|ctx| {
        let finish = |ending: Ending, value, error| report(ending, value, error, &outbox);
        if let Err(error) = install(&ctx, &outbox, bindings) {
            let message = format!("could not install the prelude: {error}");
            return finish(Ending::Threw, None, Some(internal(message)));
        }
        let wrapped = format!("__manifold_start(async () => {{{code}\n}});");
        if let Err(error) = ctx.eval::<(), _>(wrapped) {
            // A syntax error the stripper let through, or an interrupt.
            let thrown = describe_caught(&ctx, error);
            return match stop.get() {
                Some(ending) => finish(ending, None, None),
                None => finish(ending_for(&thrown, &memory), None, Some(thrown)),
            };
        }
        let mut outstanding = 0u64;
        loop {
            while ctx.execute_pending_job() {}
            outstanding += outbox.flush(host);
            if let Some(ending) = stop.get() {
                return finish(ending, None, None);
            }
            if let Some(outcome) = outcome(&ctx) {
                return match outcome {
                    Ok(value) => finish(Ending::Completed, value, None),
                    Err(error) => finish(ending_for(&error, &memory), None, Some(error)),
                };
            }
            // Nothing can run until a reply arrives; with none outstanding,
            // the script waits on something that never settles.
            let reply = if outstanding == 0 {
                wait_until(wall_deadline);
                None
            } else {
                host.next_reply(wall_deadline)
            };
            let Some(reply) = reply else {
                return finish(Ending::WallDeadline, None, None);
            };
            outstanding = outstanding.saturating_sub(1);
            if let Err(error) = settle(&ctx, reply) {
                let thrown = describe_caught(&ctx, error);
                return match stop.get() {
                    Some(ending) => finish(ending, None, None),
                    None => finish(ending_for(&thrown, &memory), None, Some(thrown)),
                };
            }
        }
    })
}

fn new_context(memory: &Rc<MemoryMeter>) -> rquickjs::Result<(Runtime, Context)> {
    let runtime = Runtime::new_with_alloc(LimitedAllocator {
        meter: Rc::clone(memory),
    })?;
    runtime.set_max_stack_size(1 << 20);
    let context = Context::full(&runtime)?;
    Ok((runtime, context))
}

/// Calls and logs the script produced since the last flush.
struct Outbox {
    calls: RefCell<Vec<(u64, String, String)>>,
    logs: RefCell<Vec<(Stream, String)>>,
    next_id: Cell<u64>,
    log_budget: Cell<usize>,
    dropped: Cell<u64>,
}

impl Outbox {
    fn new(log_bytes: usize) -> Self {
        Outbox {
            calls: RefCell::default(),
            logs: RefCell::default(),
            next_id: Cell::new(0),
            log_budget: Cell::new(log_bytes),
            dropped: Cell::new(0),
        }
    }

    fn log(&self, stream: Stream, text: String) {
        let budget = self.log_budget.get();
        let size = text.len() + 1;
        if size > budget {
            self.dropped.set(self.dropped.get() + size as u64);
            self.log_budget.set(0);
            return;
        }
        self.log_budget.set(budget - size);
        self.logs.borrow_mut().push((stream, text));
    }

    /// Hands everything to the host, logs first so they keep their order
    /// relative to the calls they describe; returns the calls sent.
    fn flush(&self, host: &mut dyn Host) -> u64 {
        for (stream, text) in self.logs.borrow_mut().drain(..) {
            host.log(stream, &text);
        }
        let mut sent = 0;
        for (id, tool, args) in self.calls.borrow_mut().drain(..) {
            let args = serde_json::from_str(&args).unwrap_or(Json::Null);
            host.call(id, &tool, args);
            sent += 1;
        }
        sent
    }
}

fn install<'js>(ctx: &Ctx<'js>, outbox: &Rc<Outbox>, bindings: &[Binding]) -> rquickjs::Result<()> {
    let send = {
        let outbox = Rc::clone(outbox);
        Function::new(ctx.clone(), move |tool: String, args: String| -> u64 {
            let id = outbox.next_id.get() + 1;
            outbox.next_id.set(id);
            outbox.calls.borrow_mut().push((id, tool, args));
            id
        })?
    };
    let log = {
        let outbox = Rc::clone(outbox);
        Function::new(ctx.clone(), move |stream: String, text: String| {
            let stream = if stream == "err" {
                Stream::Err
            } else {
                Stream::Out
            };
            outbox.log(stream, text);
        })?
    };
    let bindings = serde_json::to_string(bindings).unwrap_or_else(|_| "[]".into());
    let module = match prelude_bytecode() {
        // SAFETY: the bytes were written by `Module::write` in this process,
        // by this QuickJS build, and live for the whole process.
        Some(bytes) => unsafe { Module::load(ctx.clone(), bytes)? },
        None => Module::declare(ctx.clone(), "prelude", PRELUDE)?,
    };
    let (module, evaluated) = module.eval()?;
    evaluated.finish::<()>()?;
    let prelude: Function = module.get("default")?;
    prelude.call::<_, ()>((send, log, bindings))?;
    Ok(())
}

/// The prelude compiled once per process: compiling it was most of a cold
/// run's time.
fn prelude_bytecode() -> Option<&'static [u8]> {
    static BYTES: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    BYTES
        .get_or_init(|| {
            let runtime = Runtime::new().ok()?;
            let context = Context::full(&runtime).ok()?;
            context.with(|ctx| {
                Module::declare(ctx, "prelude", PRELUDE)
                    .ok()?
                    .write(WriteOptions::default())
                    .ok()
            })
        })
        .as_deref()
}

/// `Some` once the script has settled: its JSON value, or its error.
fn outcome(ctx: &Ctx<'_>) -> Option<Result<Option<Json>, ScriptError>> {
    let raw: Option<String> = ctx.globals().get("__manifold_outcome").ok()?;
    let raw = raw?;
    let parsed: Json = serde_json::from_str(&raw).ok()?;
    if parsed["ok"] == Json::Bool(true) {
        let value = parsed
            .get("value")
            .and_then(Json::as_str)
            .map(|v| serde_json::from_str(v).unwrap_or(Json::String(v.to_string())));
        Some(Ok(value))
    } else {
        Some(Err(script_error(&parsed["error"])))
    }
}

fn settle(ctx: &Ctx<'_>, reply: Reply) -> rquickjs::Result<()> {
    let settle: Function = ctx.globals().get("__manifold_settle")?;
    let payload = serde_json::to_string(&reply.value).unwrap_or_else(|_| "null".into());
    settle.call::<_, ()>((reply.id, reply.ok, payload))
}

fn script_error(value: &Json) -> ScriptError {
    let text = |key: &str| value.get(key).and_then(Json::as_str).map(str::to_string);
    ScriptError {
        name: text("name").unwrap_or_else(|| "Error".into()),
        message: text("message").unwrap_or_default(),
        stack: text("stack").filter(|s| !s.is_empty()),
        tool_error: value.get("toolError").cloned().filter(|v| !v.is_null()),
    }
}

fn internal(message: String) -> ScriptError {
    ScriptError {
        name: "InternalError".into(),
        message,
        stack: None,
        tool_error: None,
    }
}

/// The pending exception after `error`, described like a script error.
fn describe_caught(ctx: &Ctx<'_>, error: rquickjs::Error) -> ScriptError {
    if !matches!(error, rquickjs::Error::Exception) {
        return internal(error.to_string());
    }
    let thrown: Value = ctx.catch();
    let describe: rquickjs::Result<Function> = ctx.globals().get("__manifold_describe");
    let described = describe
        .and_then(|f| f.call::<_, String>((thrown.clone(),)))
        .ok()
        .and_then(|s| serde_json::from_str::<Json>(&s).ok());
    match described {
        Some(value) => script_error(&value),
        None => match thrown.as_exception() {
            Some(e) => ScriptError {
                name: "Error".into(),
                message: e.message().unwrap_or_default(),
                stack: e.stack(),
                tool_error: None,
            },
            None => internal("an exception that could not be described".into()),
        },
    }
}

/// Counts the heap and refuses what would pass the limit. The engine's own
/// limit reports failure as an exception the script can catch or that
/// surfaces as a bare `null`; counting here tells a refusal apart for sure.
struct MemoryMeter {
    limit: usize,
    used: Cell<usize>,
    refused: Cell<bool>,
}

impl MemoryMeter {
    fn admit(&self, more: usize) -> bool {
        let fits = self.used.get().saturating_add(more) <= self.limit;
        if !fits {
            self.refused.set(true);
        }
        fits
    }
}

struct LimitedAllocator {
    meter: Rc<MemoryMeter>,
}

// SAFETY: every pointer comes from, and goes back to, `RustAllocator`.
unsafe impl Allocator for LimitedAllocator {
    fn alloc(&mut self, size: usize) -> *mut u8 {
        if !self.meter.admit(size) {
            return std::ptr::null_mut();
        }
        let ptr = RustAllocator.alloc(size);
        self.count(ptr, 0)
    }

    fn calloc(&mut self, count: usize, size: usize) -> *mut u8 {
        if !self.meter.admit(count.saturating_mul(size)) {
            return std::ptr::null_mut();
        }
        let ptr = RustAllocator.calloc(count, size);
        self.count(ptr, 0)
    }

    unsafe fn dealloc(&mut self, ptr: *mut u8) {
        // SAFETY: the caller passes a pointer this allocator returned.
        let size = unsafe { RustAllocator::usable_size(ptr) };
        self.meter
            .used
            .set(self.meter.used.get().saturating_sub(size));
        // SAFETY: as above.
        unsafe { RustAllocator.dealloc(ptr) }
    }

    unsafe fn realloc(&mut self, ptr: *mut u8, new_size: usize) -> *mut u8 {
        let old = if ptr.is_null() {
            0
        } else {
            // SAFETY: the caller passes a pointer this allocator returned.
            unsafe { RustAllocator::usable_size(ptr) }
        };
        if new_size > old && !self.meter.admit(new_size - old) {
            return std::ptr::null_mut();
        }
        // SAFETY: as above.
        let moved = unsafe { RustAllocator.realloc(ptr, new_size) };
        self.count(moved, old)
    }

    unsafe fn usable_size(ptr: *mut u8) -> usize {
        // SAFETY: the caller passes a pointer this allocator returned.
        unsafe { RustAllocator::usable_size(ptr) }
    }
}

impl LimitedAllocator {
    fn count(&self, ptr: *mut u8, replaced: usize) -> *mut u8 {
        if !ptr.is_null() {
            // SAFETY: `ptr` was just returned by `RustAllocator`.
            let size = unsafe { RustAllocator::usable_size(ptr) };
            let used = self.meter.used.get().saturating_sub(replaced);
            self.meter.used.set(used.saturating_add(size));
        }
        ptr
    }
}

fn ending_for(error: &ScriptError, memory: &MemoryMeter) -> Ending {
    if memory.refused.get() || error.message == "out of memory" {
        Ending::MemoryLimit
    } else {
        Ending::Threw
    }
}

fn wait_until(deadline: Instant) {
    let now = Instant::now();
    if deadline > now {
        std::thread::sleep(deadline - now);
    }
}

/// CPU time used by the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
