//! The worker's side of the pipe: read a run, drive the engine, write its
//! calls, logs and report. Blocking and single-threaded on purpose: the
//! worker needs no runtime, and a small syscall surface keeps the seccomp
//! allow-list small.

use std::{
    fs::File,
    io::{BufRead, BufReader, Write},
    os::fd::AsRawFd,
    time::Instant,
};

use serde_json::Value as Json;

use crate::{
    engine::{self, Host, Reply, Stream},
    protocol::{FromWorker, ToWorker},
};

/// Serves runs read from `input` until it closes. `ready` is sent first.
pub fn serve(input: File, mut output: impl Write, ready: Json) -> std::io::Result<()> {
    let mut input = BufReader::new(input);
    send(&mut output, &FromWorker::Ready { isolation: ready })?;
    let mut line = String::new();
    loop {
        line.clear();
        if input.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let Ok(ToWorker::Run {
            code,
            bindings,
            limits,
        }) = serde_json::from_str(&line)
        else {
            // A reply to a run that already ended, or noise: nothing waits for it.
            continue;
        };
        let mut host = PipeHost {
            input: &mut input,
            output: &mut output,
            failed: None,
        };
        let report = engine::run(&code, &bindings, &limits, &mut host);
        if let Some(error) = host.failed {
            return Err(error);
        }
        send(&mut output, &FromWorker::Done { report })?;
    }
}

fn send(output: &mut impl Write, message: &FromWorker) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message)?;
    line.push(b'\n');
    output.write_all(&line)?;
    output.flush()
}

struct PipeHost<'a, W: Write> {
    input: &'a mut BufReader<File>,
    output: &'a mut W,
    /// The pipe broke: the run cannot go on and the worker should exit.
    failed: Option<std::io::Error>,
}

impl<W: Write> PipeHost<'_, W> {
    fn emit(&mut self, message: &FromWorker) {
        if self.failed.is_none()
            && let Err(error) = send(self.output, message)
        {
            self.failed = Some(error);
        }
    }

    /// Waits for input until `deadline`; true when a line can be read.
    fn readable(&mut self, deadline: Instant) -> bool {
        if !self.input.buffer().is_empty() {
            return true;
        }
        let timeout = deadline.saturating_duration_since(Instant::now());
        let mut fd = libc::pollfd {
            fd: self.input.get_ref().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let millis = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd for the duration of the call.
        let ready = unsafe { libc::poll(&mut fd, 1, millis) };
        ready > 0
    }
}

impl<W: Write> Host for PipeHost<'_, W> {
    fn call(&mut self, id: u64, tool: &str, args: Json) {
        self.emit(&FromWorker::Call {
            id,
            tool: tool.to_string(),
            args,
        });
    }

    fn log(&mut self, stream: Stream, text: &str) {
        self.emit(&FromWorker::Log {
            stream,
            text: text.to_string(),
        });
    }

    fn next_reply(&mut self, deadline: Instant) -> Option<Reply> {
        let mut line = String::new();
        while self.failed.is_none() && Instant::now() < deadline {
            if !self.readable(deadline) {
                continue;
            }
            line.clear();
            match self.input.read_line(&mut line) {
                Ok(0) => {
                    self.failed = Some(std::io::ErrorKind::UnexpectedEof.into());
                }
                Ok(_) => {
                    if let Ok(ToWorker::Reply(reply)) = serde_json::from_str(&line) {
                        return Some(reply);
                    }
                }
                Err(error) => self.failed = Some(error),
            }
        }
        None
    }
}
