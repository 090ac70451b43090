//! Keep-alive HTTP/1.1 connections to a plain `http://` upstream, each
//! driven by the task of the call that uses it.
//!
//! hyper's pooled client runs every connection as a task of its own: a
//! call hands its request to that task and gets the reply back from it, and
//! when the reply arrives before the connection is ready again, one more
//! task is spawned to put it back in the pool. On two worker threads those
//! hand-overs woke the other worker on nearly every call, a futex wake and
//! a thread switch each, which on a virtual machine cost more than the
//! call's own work. Here a call takes an idle connection and polls it
//! itself, beside its request, until the reply is read; then the
//! connection goes back on the idle list. The connection's wakes to the
//! request come while this task polls both, and are taken in the same poll
//! ([`manifold_wake`]), so they do not reschedule the task either.

use std::{
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{Connection, SendRequest, handshake};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::reply::{BoxError, ReplyBody};

/// An idle connection closes after this long, as reqwest's did for the
/// upstream (servers often close theirs after 5 s).
const IDLE_TIMEOUT: Duration = Duration::from_secs(4);
/// Idle connections kept at most; more are closed as they come back.
const MAX_IDLE: usize = 64;

type Driver = Connection<TokioIo<TcpStream>, Full<Bytes>>;

struct Conn {
    sender: SendRequest<Full<Bytes>>,
    driver: Driver,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// Connections to one upstream.
pub(crate) struct OwnConnections {
    /// The host to resolve (when nothing is pinned), and its port.
    host: String,
    port: u16,
    pinned: Option<SocketAddr>,
    /// `Host` as the URL gives it, and the request target in origin form.
    host_header: HeaderValue,
    target: http::Uri,
    idle: Arc<Mutex<Vec<Idle>>>,
    sweeping: Arc<AtomicBool>,
}

impl OwnConnections {
    /// For a plain `http://` URL; `None` for anything else.
    pub(crate) fn new(url: &reqwest::Url, pinned: Option<SocketAddr>) -> Option<Self> {
        if url.scheme() != "http" {
            return None;
        }
        let host = url.host_str()?.to_string();
        let port = url.port_or_known_default()?;
        let authority = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.clone(),
        };
        let target = match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_string(),
        };
        Some(Self {
            // An IPv6 literal resolves without its brackets.
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port,
            pinned,
            host_header: HeaderValue::from_str(&authority).ok()?,
            target: http::Uri::try_from(target).ok()?,
            idle: Arc::default(),
            sweeping: Arc::default(),
        })
    }

    /// POSTs `body` with `headers` and gives the reply to `read`, polling
    /// the connection until `read` is done. A request that never left is
    /// sent again on another connection; one that did is not (a call may
    /// not be safe to repeat).
    pub(crate) async fn post<R, F: Future<Output = R>>(
        &self,
        headers: HeaderMap,
        body: Bytes,
        read: impl FnOnce(http::Response<ReplyBody>) -> F,
    ) -> Result<R, BoxError> {
        let mut request = http::Request::post(self.target.clone()).body(Full::new(body))?;
        *request.headers_mut() = headers;
        request
            .headers_mut()
            .insert(header::HOST, self.host_header.clone());
        loop {
            let (mut conn, fresh) = match self.take_idle() {
                Some(conn) => (conn, false),
                None => (self.connect().await?, true),
            };
            let (ready, open) = drive(&mut conn.driver, conn.sender.ready()).await;
            let ready: Result<(), BoxError> = match ready {
                Ok(()) if open => Ok(()),
                Ok(()) => Err("the upstream closed the connection".into()),
                Err(error) => Err(error.into()),
            };
            if let Err(error) = ready {
                // An idle connection the upstream closed meanwhile.
                if fresh {
                    return Err(error);
                }
                continue;
            }
            let (sent, open) = drive(&mut conn.driver, conn.sender.try_send_request(request)).await;
            let response = match sent {
                Ok(response) => response,
                Err(mut unsent) => match unsent.take_message() {
                    // Closed under us before the request went out.
                    Some(again) if !fresh => {
                        request = again;
                        continue;
                    }
                    _ => return Err(unsent.into_error().into()),
                },
            };
            let response = response.map(|body| body.map_err(BoxError::from).boxed());
            let (reply, open) = if open {
                drive(&mut conn.driver, read(response)).await
            } else {
                (read(response).await, false)
            };
            if open && conn.sender.is_ready() {
                self.put_idle(conn);
            }
            return Ok(reply);
        }
    }

    fn take_idle(&self) -> Option<Conn> {
        let mut idle = lock(&self.idle);
        while let Some(entry) = idle.pop() {
            if entry.since.elapsed() < IDLE_TIMEOUT {
                return Some(entry.conn);
            }
        }
        None
    }

    fn put_idle(&self, conn: Conn) {
        let mut idle = lock(&self.idle);
        if idle.len() >= MAX_IDLE {
            return;
        }
        idle.push(Idle {
            conn,
            since: Instant::now(),
        });
        drop(idle);
        self.sweep_later();
    }

    /// One task at a time closes connections idle past [`IDLE_TIMEOUT`],
    /// and ends when none are left.
    fn sweep_later(&self) {
        if self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.sweeping.store(false, Ordering::Release);
            return;
        };
        let (idle, sweeping) = (Arc::downgrade(&self.idle), Arc::clone(&self.sweeping));
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(IDLE_TIMEOUT).await;
                let Some(idle) = idle.upgrade() else { return };
                let mut idle = lock(&idle);
                idle.retain(|entry| entry.since.elapsed() < IDLE_TIMEOUT);
                if idle.is_empty() {
                    sweeping.store(false, Ordering::Release);
                    return;
                }
            }
        });
    }

    async fn connect(&self) -> Result<Conn, BoxError> {
        let addresses: Vec<SocketAddr> = match self.pinned {
            // The pinned address with the URL's port, as reqwest resolved it.
            Some(address) => vec![SocketAddr::new(address.ip(), self.port)],
            None => tokio::net::lookup_host((self.host.as_str(), self.port))
                .await?
                .collect(),
        };
        let mut failed = None;
        for address in addresses {
            match TcpStream::connect(address).await {
                Ok(stream) => {
                    stream.set_nodelay(true)?;
                    let (sender, driver) = handshake(TokioIo::new(stream)).await?;
                    return Ok(Conn { sender, driver });
                }
                Err(error) => failed = Some(error),
            }
        }
        Err(failed
            .unwrap_or_else(|| std::io::Error::other(format!("{} resolved to nothing", self.host)))
            .into())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Polls `work`, then the connection, in this task until `work` is done;
/// gives its output and whether the connection is still open. The
/// connection is polled once more after `work` is done, so that a finished
/// exchange leaves it ready for the next request.
async fn drive<W: Future>(driver: &mut Driver, work: W) -> (W::Output, bool) {
    let mut work = std::pin::pin!(work);
    let mut open = true;
    let output = manifold_wake::self_wakes(std::future::poll_fn(|cx| {
        let done = work.as_mut().poll(cx);
        // A connection that ended (closed, or failed) fails the work that
        // waits on it, which then comes out as its error.
        if open && Pin::new(&mut *driver).poll(cx).is_ready() {
            open = false;
        }
        done
    }))
    .await;
    (output, open)
}
