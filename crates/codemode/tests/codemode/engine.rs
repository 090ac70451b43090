//! The engine in process: the script's semantics and the limits the engine
//! itself enforces. The host here answers from a table of Rust closures.

use std::{collections::VecDeque, time::Instant};

use manifold_codemode::engine::{self, Binding, Ending, EngineLimits, Host, Reply, Stream};
use manifold_codemode::strip_types;
use serde_json::{Value, json};

type Tool = Box<dyn Fn(&Value) -> Result<Value, Value>>;

#[derive(Default)]
struct TableHost {
    tools: Vec<(&'static str, Tool)>,
    queue: VecDeque<Reply>,
    calls: Vec<(String, Value)>,
    out: Vec<(Stream, String)>,
}

impl TableHost {
    fn with(
        mut self,
        name: &'static str,
        f: impl Fn(&Value) -> Result<Value, Value> + 'static,
    ) -> Self {
        self.tools.push((name, Box::new(f)));
        self
    }

    fn stdout(&self) -> Vec<&str> {
        self.out
            .iter()
            .filter(|(s, _)| *s == Stream::Out)
            .map(|(_, t)| t.as_str())
            .collect()
    }
}

impl Host for TableHost {
    fn call(&mut self, id: u64, tool: &str, args: Value) {
        self.calls.push((tool.to_string(), args.clone()));
        let (server, name) = tool.split_once("__").unwrap_or(("?", tool));
        let reply = match self.tools.iter().find(|(n, _)| *n == tool) {
            Some((_, f)) => match f(&args) {
                Ok(result) => Reply {
                    id,
                    ok: true,
                    value: json!({ "result": result, "server": server, "tool": name }),
                },
                Err(content) => Reply {
                    id,
                    ok: false,
                    value: json!({ "message": "the tool reported an error", "server": server, "tool": name, "content": content }),
                },
            },
            None => Reply {
                id,
                ok: false,
                value: json!({ "message": format!("unknown tool '{tool}'"), "code": "unknown_tool" }),
            },
        };
        self.queue.push_back(reply);
    }

    fn log(&mut self, stream: Stream, text: &str) {
        self.out.push((stream, text.to_string()));
    }

    fn next_reply(&mut self, _deadline: Instant) -> Option<Reply> {
        self.queue.pop_front()
    }
}

fn logs_host() -> TableHost {
    TableHost::default()
        .with("logs__search", |args| {
            let level = args["level"].as_str().unwrap_or("info").to_string();
            Ok(json!({
                "content": [{ "type": "text", "text": "3 lines" }],
                "structuredContent": { "lines": [
                    { "level": level, "message": "disk full" },
                    { "level": level, "message": "disk full" },
                    { "level": level, "message": "timeout" },
                ]},
            }))
        })
        .with("tickets__create", |args| {
            Ok(json!({ "content": [{ "type": "text", "text": format!("created {}", args["title"]) }] }))
        })
        .with("tickets__fail", |_| Err(json!([{ "type": "text", "text": "quota exceeded" }])))
}

fn bindings() -> Vec<Binding> {
    let bind = |ns: &str, f: &str, tool: &str, structured| Binding {
        namespace: ns.into(),
        function: f.into(),
        tool: tool.into(),
        structured,
    };
    vec![
        bind("logs", "search", "logs__search", true),
        bind("tickets", "create", "tickets__create", false),
        bind("tickets", "fail", "tickets__fail", false),
    ]
}

fn run_ts(source: &str, host: &mut TableHost, limits: &EngineLimits) -> engine::RunReport {
    let js = strip_types(source).expect("the script parses");
    engine::run(&js, &bindings(), limits, host)
}

fn run(source: &str, host: &mut TableHost) -> engine::RunReport {
    run_ts(source, host, &EngineLimits::default())
}

#[test]
fn typescript_with_types_enums_generics_and_class_fields_runs() {
    let mut host = logs_host();
    let report = run(
        r#"
enum Level { Error = "error", Warn = "warn" }
interface Line { level: string; message: string }
class Counter<T> {
  private seen = new Map<T, number>();
  add(item: T): void { this.seen.set(item, (this.seen.get(item) ?? 0) + 1); }
  get size(): number { return this.seen.size; }
}
function first<T>(items: T[]): T | undefined { return items[0]; }
const result = await logs.search({ level: Level.Error });
const counter = new Counter<string>();
for (const line of result.lines as Line[]) counter.add(line.message);
console.log(`distinct: ${counter.size}`, first(result.lines)?.level);
return { distinct: counter.size };
"#,
        &mut host,
    );
    assert_eq!(report.ending, Ending::Completed, "{report:?}");
    assert_eq!(report.value, Some(json!({ "distinct": 2 })));
    assert_eq!(host.stdout(), ["distinct: 2 error"]);
    assert_eq!(
        host.calls,
        [("logs__search".to_string(), json!({ "level": "error" }))]
    );
}

#[test]
fn the_seed_example_dedupes_and_opens_one_ticket_each() {
    let mut host = logs_host();
    let report = run(
        r#"
const { lines } = await logs.search({ level: "error" });
const unique = [...new Set(lines.map((l: { message: string }) => l.message))];
await Promise.all(unique.map((m) => tickets.create({ title: m })));
console.log(`opened ${unique.length} tickets`);
"#,
        &mut host,
    );
    assert_eq!(report.ending, Ending::Completed, "{report:?}");
    assert_eq!(report.value, None);
    assert_eq!(report.calls, 3);
    let titles: Vec<&Value> = host.calls[1..].iter().map(|(_, a)| &a["title"]).collect();
    assert_eq!(titles, [&json!("disk full"), &json!("timeout")]);
    assert_eq!(host.stdout(), ["opened 2 tickets"]);
}

#[test]
fn a_tool_error_is_catchable_with_its_server_tool_and_content() {
    let mut host = logs_host();
    let report = run(
        r#"
try {
  await tickets.fail({});
  return "not reached";
} catch (e) {
  if (!(e instanceof ToolError)) throw e;
  return { name: e.name, server: e.server, tool: e.tool, text: (e.content as any)[0].text };
}
"#,
        &mut host,
    );
    assert_eq!(report.ending, Ending::Completed, "{report:?}");
    assert_eq!(
        report.value,
        Some(
            json!({ "name": "ToolError", "server": "tickets", "tool": "fail", "text": "quota exceeded" })
        )
    );
}

#[test]
fn an_uncaught_error_returns_its_stack_and_the_logs_so_far() {
    let mut host = logs_host();
    let report = run(
        r#"
console.log("before");
function explode(): never { throw new RangeError("boom"); }
explode();
console.log("after");
"#,
        &mut host,
    );
    assert_eq!(report.ending, Ending::Threw);
    let error = report.error.expect("an error");
    assert_eq!(
        (error.name.as_str(), error.message.as_str()),
        ("RangeError", "boom")
    );
    assert!(
        error.stack.as_deref().unwrap_or("").contains("explode"),
        "{error:?}"
    );
    assert_eq!(host.stdout(), ["before"]);

    let mut host = logs_host();
    let report = run("await tickets.fail({});", &mut host);
    assert_eq!(report.ending, Ending::Threw);
    let error = report.error.unwrap();
    assert_eq!(error.name, "ToolError");
    assert_eq!(error.tool_error.unwrap()["tool"], "fail");

    let mut host = logs_host();
    let report = run("await Promise.reject(42);", &mut host);
    assert_eq!(report.error.unwrap().message, "Uncaught 42");
}

#[test]
fn an_endless_loop_is_stopped_by_the_cpu_deadline_even_inside_try_catch() {
    let limits = EngineLimits {
        cpu_ms: 200,
        ..EngineLimits::default()
    };
    for script in [
        "while (true) {}",
        "for (;;) { try { while (true) {} } catch (e) { console.log('caught', e); } }",
        "await logs.search({}); try { while (true) {} } finally { console.log('finally'); }",
    ] {
        let mut host = logs_host();
        let started = Instant::now();
        let report = run_ts(script, &mut host, &limits);
        assert_eq!(report.ending, Ending::CpuDeadline, "{script}: {report:?}");
        assert!(started.elapsed().as_secs() < 10);
        assert!(report.cpu_us >= 200_000, "{report:?}");
        assert!(
            host.stdout().is_empty(),
            "{script}: nothing catches the deadline: {:?}",
            host.out
        );
    }
}

#[test]
fn a_promise_that_never_resolves_is_stopped_by_the_wall_deadline() {
    let limits = EngineLimits {
        wall_ms: 300,
        ..EngineLimits::default()
    };
    let mut host = logs_host();
    let started = Instant::now();
    let report = run_ts(
        "console.log('waiting'); await new Promise(() => {});",
        &mut host,
        &limits,
    );
    assert_eq!(report.ending, Ending::WallDeadline, "{report:?}");
    assert!(started.elapsed().as_millis() >= 300);
    assert_eq!(host.stdout(), ["waiting"]);
}

#[test]
fn a_huge_allocation_is_stopped_by_the_memory_limit() {
    let limits = EngineLimits {
        memory_bytes: 16 << 20,
        ..EngineLimits::default()
    };
    for script in [
        "const a = []; while (true) a.push('x'.repeat(1024) + a.length);",
        "const big = new ArrayBuffer(1 << 30); return big.byteLength;",
        "return 'x'.repeat(1 << 28).length;",
    ] {
        let mut host = logs_host();
        let report = run_ts(script, &mut host, &limits);
        assert_eq!(report.ending, Ending::MemoryLimit, "{script}: {report:?}");
    }
}

#[test]
fn no_network_module_or_host_apis_exist() {
    let mut host = logs_host();
    let report = run(
        r#"
const absent = ["fetch", "XMLHttpRequest", "WebSocket", "require", "process", "std", "os", "Deno", "Bun", "setTimeout"]
  .filter((name) => typeof (globalThis as any)[name] !== "undefined");
let dynamicImport: string;
try { await import("os"); dynamicImport = "loaded"; } catch (e) { dynamicImport = "refused: " + (e as Error).message; }
return { present: absent, dynamicImport };
"#,
        &mut host,
    );
    assert_eq!(report.ending, Ending::Completed, "{report:?}");
    let value = report.value.unwrap();
    assert_eq!(value["present"], json!([]), "{value}");
    assert!(
        value["dynamicImport"]
            .as_str()
            .unwrap()
            .starts_with("refused"),
        "{value}"
    );
}

#[test]
fn results_carry_their_source_without_changing_their_json() {
    let mut host = logs_host();
    let report = run(
        r#"
const r = await logs.search({});
const t = await tickets.create({ title: "x" });
return { source: r.source, ticketSource: t.source, keys: Object.keys(r) };
"#,
        &mut host,
    );
    assert_eq!(
        report.value,
        Some(json!({
            "source": { "server": "logs", "tool": "search" },
            "ticketSource": { "server": "tickets", "tool": "create" },
            "keys": ["lines"],
        }))
    );
}

#[test]
fn call_tool_reaches_any_tool_and_logs_are_capped() {
    let mut host = logs_host();
    let limits = EngineLimits {
        log_bytes: 100,
        ..EngineLimits::default()
    };
    let report = run_ts(
        r#"
const r = await callTool("tickets__create", { title: "y" });
for (let i = 0; i < 100; i++) console.log("line " + i);
return r.content[0].text;
"#,
        &mut host,
        &limits,
    );
    assert_eq!(report.value, Some(json!("created \"y\"")));
    let kept: usize = host.out.iter().map(|(_, t)| t.len() + 1).sum();
    assert!(kept <= 100, "{kept}");
    assert!(report.log_bytes_dropped > 0);
}
