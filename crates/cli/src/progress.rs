//! Progress of long CLI work (a large `import`, and in `manifold-bench` a
//! first catalog embedding, `eval search`, `search`): a bar on a terminal
//! (`indicatif`), plain lines otherwise, so a log or CI output gets a few
//! readable lines instead of control codes. Everything goes to stderr;
//! stdout stays the command's result.

use std::{
    io::IsTerminal,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Plain lines are written at most this often, besides the first and last.
const LINE_EVERY: Duration = Duration::from_secs(5);

pub struct Progress {
    label: String,
    total: u64,
    done: AtomicU64,
    started: Instant,
    bar: Option<ProgressBar>,
    /// When the last plain line was written, and how far it said.
    last_line: Mutex<(Instant, u64)>,
}

impl Progress {
    /// A bar if stderr is a terminal, else plain lines.
    pub fn new(label: &str, total: u64) -> Arc<Progress> {
        Self::with_bar(label, total, std::io::stderr().is_terminal())
    }

    pub fn with_bar(label: &str, total: u64, bar: bool) -> Arc<Progress> {
        let bar = bar.then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{msg} [{bar:30}] {pos}/{len} ({elapsed}, about {eta} left)",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar.set_message(label.to_string());
            bar
        });
        let now = Instant::now();
        if bar.is_none() {
            eprintln!("{label}: 0/{total}");
        }
        Arc::new(Progress {
            label: label.to_string(),
            total,
            done: AtomicU64::new(0),
            started: now,
            bar,
            last_line: Mutex::new((now, 0)),
        })
    }

    pub fn inc(&self, n: u64) {
        let done = self.done.fetch_add(n, Ordering::Relaxed) + n;
        self.show(done);
    }

    pub fn set(&self, done: u64) {
        self.done.store(done, Ordering::Relaxed);
        self.show(done);
    }

    fn show(&self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            return;
        }
        let mut last = self.last_line.lock().unwrap_or_else(|p| p.into_inner());
        // Every tenth of the way or every few seconds, never twice the same.
        let tenth = (self.total / 10).max(1);
        let due = done >= last.1 + tenth || last.0.elapsed() >= LINE_EVERY;
        // The last one is `finish`'s.
        if due && done != last.1 && done < self.total {
            eprintln!("{}: {done}/{}", self.label, self.total);
            *last = (Instant::now(), done);
        }
    }

    /// The last line: how much was done and how long it took.
    pub fn finish(&self) {
        let done = self.done.load(Ordering::Relaxed);
        let line = format!(
            "{}: {done}/{} in {:.1} s",
            self.label,
            self.total,
            self.started.elapsed().as_secs_f64()
        );
        match &self.bar {
            Some(bar) => bar.finish_with_message(line),
            None => eprintln!("{line}"),
        }
    }
}
