//! The isolation layers, checked from inside a real child process.
//!
//! The binary re-executes itself with `--isolation-child <scenario> <config>`
//! and an empty environment. The child isolates itself, prints its report and
//! probes as one JSON line, then does what a worker does (QuickJS work, GC,
//! a line from stdin, poll with a timeout, stdout and stderr, clocks) and
//! exits 0. The parent checks that every layer reported active really blocks
//! its probes.

use manifold_codemode::isolation::{
    DISABLED, IsolationConfig, IsolationReport, Probe, isolate, probe,
};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Read, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const CHILD_FLAG: &str = "--isolation-child";
const JSON_PREFIX: &str = "ISOLATION-JSON ";
const STDIN_LINE: &str = "ping from parent";

#[derive(Serialize, Deserialize)]
struct ChildOutput {
    report: IsolationReport,
    probes: Vec<Probe>,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(CHILD_FLAG) {
        let config: IsolationConfig = serde_json::from_str(&args[3]).expect("child config");
        child(&args[2], &config);
    }
    let tests: &[(&str, fn())] = &[
        (
            "every_layer_is_active_and_blocks",
            every_layer_is_active_and_blocks,
        ),
        (
            "network_namespace_alone_blocks_the_network",
            network_namespace_alone,
        ),
        ("landlock_alone_blocks_the_filesystem", landlock_alone),
        ("seccomp_alone_blocks_everything", seccomp_alone),
        (
            "disabled_layers_are_reported_and_probes_see_through",
            disabled_layers,
        ),
        (
            "panic_with_backtrace_under_seccomp_does_not_hang",
            panic_under_seccomp,
        ),
        ("abort_under_seccomp_raises_sigabrt", abort_under_seccomp),
        ("stderr_to_a_regular_file_keeps_working", stderr_to_a_file),
    ];
    let filters: Vec<&String> = args[1..].iter().filter(|a| !a.starts_with('-')).collect();
    let exact = args.iter().any(|a| a == "--exact");
    let selected: Vec<&(&str, fn())> = tests
        .iter()
        .filter(|(name, _)| {
            filters.is_empty()
                || filters.iter().any(|f| {
                    if exact {
                        name == f
                    } else {
                        name.contains(f.as_str())
                    }
                })
        })
        .collect();
    // libtest's `--list` format, so runners (cargo test, nextest) see every
    // test by name: a custom main must not hide its tests.
    if args.iter().any(|a| a == "--list") {
        // None of these tests is ignored.
        if args.iter().any(|a| a == "--ignored") {
            return;
        }
        for (name, _) in &selected {
            println!("{name}: test");
        }
        return;
    }
    println!("\nrunning {} tests", selected.len());
    for (name, test) in &selected {
        println!("test {name} ... ");
        test();
        println!("test {name} ... ok");
    }
    // A failing test panics above and exits non-zero; this is libtest's
    // closing line for a run with no failure.
    println!(
        "\ntest result: ok. {} passed; 0 failed; 0 ignored; 0 measured; {} filtered out\n",
        selected.len(),
        tests.len() - selected.len()
    );
}

// ---------------------------------------------------------------- child side

fn child(scenario: &str, config: &IsolationConfig) -> ! {
    let report = isolate(config);
    match scenario {
        "work" => {
            let output = ChildOutput {
                report,
                probes: probe(),
            };
            println!(
                "{JSON_PREFIX}{}",
                serde_json::to_string(&output).expect("json")
            );
            worker_sequence();
            std::process::exit(0);
        }
        "panic" => {
            let default_hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                eprintln!("backtrace:\n{}", std::backtrace::Backtrace::force_capture());
                default_hook(info);
            }));
            assert!(report.is_active("seccomp"), "{report:?}");
            panic!("deliberate panic after isolation");
        }
        "abort" => {
            assert!(report.is_active("seccomp"), "{report:?}");
            std::process::abort();
        }
        other => panic!("unknown scenario {other}"),
    }
}

/// What the worker does once isolated; any failure exits non-zero.
fn worker_sequence() {
    let started = Instant::now();

    let rt = rquickjs::Runtime::new().expect("runtime");
    rt.set_memory_limit(512 << 20);
    let ctx = rquickjs::Context::full(&rt).expect("context");
    let len: usize = ctx.with(|ctx| {
        ctx.eval(
            "const a = Array.from({ length: 1e5 }, (_, i) => ({ i, s: 'item' + i, r: Math.random() }));\
             const t = Date.now();\
             JSON.stringify(a).length + (t > 0 ? 0 : 1)",
        )
        .expect("eval")
    });
    assert!(len > 1_000_000, "stringified length {len}");
    rt.run_gc();
    println!("js ok: {len} bytes");

    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).expect("stdin");
    assert_eq!(line.trim_end(), STDIN_LINE);

    // The parent keeps stdin open: the poll must time out, not fail.
    let mut fds = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    let polled = unsafe { libc::poll(&mut fds, 1, 100) };
    assert_eq!(polled, 0, "poll: {}", std::io::Error::last_os_error());

    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a live timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime: {}", std::io::Error::last_os_error());
    assert!(ts.tv_sec > 0 || ts.tv_nsec > 0);

    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(100), "{elapsed:?}");
    println!("stdin ok: {}", line.trim_end());
    eprintln!("stderr ok");
    println!(
        "work done in {elapsed:?}, cpu {}.{:09}s",
        ts.tv_sec, ts.tv_nsec
    );
}

// --------------------------------------------------------------- parent side

struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Run {
    fn output(&self) -> ChildOutput {
        let line = self
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix(JSON_PREFIX))
            .unwrap_or_else(|| panic!("no report from child\n{}", self.describe()));
        serde_json::from_str(line).expect("child json")
    }

    fn describe(&self) -> String {
        format!(
            "status: {:?}\nstdout:\n{}\nstderr:\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

fn run_child(scenario: &str, config: &IsolationConfig) -> Run {
    run_child_with(scenario, config, Stdio::piped())
}

fn run_child_with(scenario: &str, config: &IsolationConfig, stderr: Stdio) -> Run {
    let mut child = Command::new(std::env::current_exe().expect("current exe"))
        .arg(CHILD_FLAG)
        .arg(scenario)
        .arg(serde_json::to_string(config).expect("json"))
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("spawn child");
    // Kept open until the child is done, so its poll times out.
    let mut stdin = child.stdin.take().expect("stdin");
    // A scenario that never reads stdin (a panic right after isolation) may
    // have exited already: its status and output are what the test checks.
    if let Err(e) = writeln!(stdin, "{STDIN_LINE}") {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write stdin: {e}");
    }
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take();
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).map(|_| s)
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        match err.as_mut() {
            Some(err) => err.read_to_string(&mut s).map(|_| s),
            None => Ok(s),
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().ok();
            let _ = child.wait();
            panic!("child {scenario} hung for 60s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(stdin);
    let run = Run {
        status,
        stdout: out_reader.join().unwrap().expect("child stdout"),
        stderr: err_reader.join().unwrap().expect("child stderr"),
    };
    eprintln!("  [{scenario}] {:?}", run.status);
    run
}

/// Runs the worker scenario, checks it exited 0 after the real work, and
/// that every probe with an active layer that should block it is blocked.
fn run_worker(config: &IsolationConfig) -> ChildOutput {
    let run = run_child("work", config);
    assert!(run.stderr.contains("stderr ok"), "{}", run.describe());
    check_worker(&run)
}

fn check_worker(run: &Run) -> ChildOutput {
    assert!(run.status.success(), "{}", run.describe());
    assert!(run.stdout.contains("js ok:"), "{}", run.describe());
    assert!(
        run.stdout.contains(&format!("stdin ok: {STDIN_LINE}")),
        "{}",
        run.describe()
    );
    let output = run.output();
    for layer in &output.report.layers {
        eprintln!(
            "  layer {:<18} {:<8} {}",
            layer.name,
            if layer.active { "active" } else { "INACTIVE" },
            layer.detail
        );
    }
    for p in &output.probes {
        eprintln!(
            "  probe {:<24} {:<8} {}",
            p.name,
            if p.blocked { "blocked" } else { "OPEN" },
            p.detail
        );
    }
    for p in &output.probes {
        let blockers = blockers(&p.name);
        assert!(!blockers.is_empty(), "probe {} has no layer", p.name);
        let active: Vec<&str> = blockers
            .iter()
            .copied()
            .filter(|l| output.report.is_active(l))
            .collect();
        assert!(
            active.is_empty() || p.blocked,
            "probe {} is open although {active:?} is active: {}",
            p.name,
            p.detail
        );
    }
    output
}

/// The layers that each, alone, must make a probe fail.
fn blockers(probe: &str) -> &'static [&'static str] {
    match probe {
        "tcp_connect_127.0.0.1" => &["network_namespace", "seccomp"],
        "read_etc_passwd" | "read_proc_self_environ" | "create_file_in_tmp" => {
            &["landlock", "seccomp"]
        }
        // Landlock lets fork through but denies the execve.
        "spawn_process" => &["landlock", "seccomp"],
        "fork" | "mmap_executable" => &["seccomp"],
        "environment_empty" => &["clean_environment"],
        _ => &[],
    }
}

fn probe_named<'a>(output: &'a ChildOutput, name: &str) -> &'a Probe {
    output
        .probes
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no probe {name}"))
}

fn only(network_namespace: bool, landlock: bool, seccomp: bool) -> IsolationConfig {
    IsolationConfig {
        network_namespace,
        landlock,
        seccomp,
        ..IsolationConfig::default()
    }
}

fn every_layer_is_active_and_blocks() {
    let output = run_worker(&IsolationConfig::default());
    let names: Vec<&str> = output
        .report
        .layers
        .iter()
        .map(|l| l.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "clean_environment",
            "network_namespace",
            "landlock",
            "rlimits",
            "no_new_privs",
            "seccomp"
        ]
    );
    assert!(
        output.report.all_active(),
        "inactive on this machine: {:?}",
        output.report.inactive()
    );
    assert!(
        output
            .report
            .layer("landlock")
            .unwrap()
            .detail
            .starts_with("fully enforced"),
        "{:?}",
        output.report.layer("landlock")
    );
    for p in &output.probes {
        assert!(p.blocked, "{p:?}");
    }
}

fn network_namespace_alone() {
    let output = run_worker(&only(true, false, false));
    assert!(output.report.is_active("network_namespace"));
    let tcp = probe_named(&output, "tcp_connect_127.0.0.1");
    // The socket opens; the route does not exist in the new namespace.
    assert!(tcp.detail.contains("unreachable"), "{tcp:?}");
    // Without Landlock and seccomp the filesystem probes see through.
    assert!(!probe_named(&output, "read_etc_passwd").blocked);
}

fn landlock_alone() {
    let output = run_worker(&only(false, true, false));
    assert!(output.report.is_active("landlock"));
    for name in [
        "read_etc_passwd",
        "read_proc_self_environ",
        "create_file_in_tmp",
        "spawn_process",
    ] {
        let p = probe_named(&output, name);
        assert!(p.detail.contains("Permission denied"), "{p:?}");
    }
    assert!(!probe_named(&output, "fork").blocked);
}

fn seccomp_alone() {
    let output = run_worker(&only(false, false, true));
    assert!(output.report.is_active("seccomp"));
    for p in output
        .probes
        .iter()
        .filter(|p| p.name != "environment_empty")
    {
        assert!(
            p.blocked && p.detail.contains("Operation not permitted"),
            "{p:?}"
        );
    }
}

fn disabled_layers() {
    let output = run_worker(&only(false, false, false));
    for name in ["network_namespace", "landlock", "seccomp"] {
        let layer = output.report.layer(name).unwrap();
        assert!(!layer.active, "{layer:?}");
        assert_eq!(layer.detail, DISABLED);
    }
    assert_eq!(output.report.inactive().len(), 3);
    // The probes are real: with those layers off they get through.
    for name in [
        "read_etc_passwd",
        "read_proc_self_environ",
        "create_file_in_tmp",
        "fork",
        "spawn_process",
        "mmap_executable",
    ] {
        let p = probe_named(&output, name);
        assert!(!p.blocked, "{p:?}");
    }
}

fn panic_under_seccomp() {
    let run = run_child("panic", &IsolationConfig::default());
    assert_eq!(run.status.code(), Some(101), "{}", run.describe());
    assert!(
        run.stderr.contains("deliberate panic after isolation"),
        "{}",
        run.describe()
    );
    assert!(run.stderr.contains("backtrace:"), "{}", run.describe());
}

fn abort_under_seccomp() {
    use std::os::unix::process::ExitStatusExt;
    let run = run_child("abort", &IsolationConfig::default());
    assert_eq!(
        run.status.signal(),
        Some(libc::SIGABRT),
        "{}",
        run.describe()
    );
}

fn stderr_to_a_file() {
    // A gateway started as `manifold ... 2>log` hands its log file down.
    let path =
        std::env::temp_dir().join(format!("manifold-isolation-stderr-{}", std::process::id()));
    let file = std::fs::File::create(&path).expect("stderr file");
    let run = run_child_with("work", &IsolationConfig::default(), Stdio::from(file));
    let stderr = std::fs::read_to_string(&path).expect("read stderr file");
    std::fs::remove_file(&path).ok();
    let output = check_worker(&run);
    assert!(stderr.contains("stderr ok"), "{stderr}");
    let rlimits = output.report.layer("rlimits").unwrap();
    assert!(rlimits.active, "{rlimits:?}");
    assert!(
        rlimits.detail.contains("FSIZE not limited: fd 2"),
        "{rlimits:?}"
    );
}
