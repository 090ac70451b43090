//! An HTTP endpoint behind a synchronous call.
//!
//! [`manifold_search::Embedder`] and [`manifold_search::Reranker`] are
//! synchronous (a local model computes on the calling thread), while reqwest
//! is async. The requests therefore run on one worker thread that owns a
//! small tokio runtime; callers block on a channel. This works from plain
//! threads and from inside another tokio runtime alike, and the runtime is
//! dropped on its own thread, never inside async code.

use std::{sync::mpsc, time::Duration};

use manifold_search::EmbedError;

type Reply<A> = mpsc::Sender<Result<A, EmbedError>>;

/// The sending end of a worker thread that answers `Q`s with `A`s.
pub(crate) struct HttpThread<Q, A> {
    requests: mpsc::Sender<(Q, Reply<A>)>,
    /// What the thread serves, for errors: `embedding`, `rerank`.
    what: &'static str,
}

/// `url` parsed, or an error naming it as `what`'s.
pub(crate) fn parse_url(what: &str, url: &str) -> Result<reqwest::Url, EmbedError> {
    reqwest::Url::parse(url).map_err(|e| EmbedError(format!("invalid {what} url {url:?}: {e}")))
}

/// A client whose every request is bounded by `timeout`, connect to last
/// byte.
pub(crate) fn client(timeout: Duration) -> Result<reqwest::Client, EmbedError> {
    reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .map_err(|e| EmbedError(format!("cannot build the HTTP client: {e}")))
}

impl<Q: Send + 'static, A: Send + 'static> HttpThread<Q, A> {
    /// Starts the thread `name`, which answers each request with `answer`
    /// until this end is dropped.
    pub(crate) fn start(
        what: &'static str,
        name: &str,
        answer: impl AsyncFn(Q) -> Result<A, EmbedError> + Send + 'static,
    ) -> Result<Self, EmbedError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| EmbedError(format!("cannot start the {what} runtime: {e}")))?;
        let (requests, received) = mpsc::channel::<(Q, Reply<A>)>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // Ends when the owner (the only sender) is dropped.
                while let Ok((request, reply)) = received.recv() {
                    let _ = reply.send(runtime.block_on(answer(request)));
                }
            })
            .map_err(|e| EmbedError(format!("cannot start the {what} thread: {e}")))?;
        Ok(HttpThread { requests, what })
    }

    /// Sends `request` and waits for its answer.
    pub(crate) fn ask(&self, request: Q) -> Result<A, EmbedError> {
        let stopped = || EmbedError(format!("the {} thread has stopped", self.what));
        let (reply, answer) = mpsc::channel();
        self.requests
            .send((request, reply))
            .map_err(|_| stopped())?;
        answer.recv().map_err(|_| stopped())?
    }
}
