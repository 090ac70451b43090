//! [`SelfWakes`]: a future whose wakes to its own task, given while the
//! task polls it, are taken in that same poll.
//!
//! A task often wakes itself: an HTTP connection's request body tells the
//! connection it wants data, a connection hands a reply to the request
//! waiting on it. tokio cannot tell such a wake from any other, so after
//! the poll the task goes back on the run queue as a yield would, and the
//! scheduler wakes another worker thread to share the work. On two worker
//! threads under a virtual machine that wake (a futex call, a thread
//! switch, an interprocessor interrupt) cost more than the request's own
//! work. Here the inner future gets a waker of our own: while we poll, a
//! wake only marks the poll to run again; between polls it wakes the task.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, Waker},
};

use futures::task::{ArcWake, AtomicWaker};

/// Polls a woken future again at most this often in one poll; past that
/// the task yields as any other would, so a future that always wakes
/// itself cannot hold the thread.
const TURNS: usize = 8;

pin_project_lite::pin_project! {
    /// See the crate's documentation.
    pub struct SelfWakes<F> {
        #[pin]
        future: F,
        turn: Arc<Turn>,
        waker: Waker,
    }
}

/// Wraps `future` so that wakes it gives its own task while polled are
/// taken in the same poll.
pub fn self_wakes<F: Future>(future: F) -> SelfWakes<F> {
    let turn = Arc::new(Turn::default());
    let waker = futures::task::waker(Arc::clone(&turn));
    SelfWakes {
        future,
        turn,
        waker,
    }
}

#[derive(Default)]
struct Turn {
    task: AtomicWaker,
    polling: AtomicBool,
    woken: AtomicBool,
}

impl ArcWake for Turn {
    fn wake_by_ref(turn: &Arc<Self>) {
        // Paired with the poll's store of `polling` then load of `woken`:
        // of a wake and the poll's end, at least one sees the other.
        turn.woken.store(true, Ordering::SeqCst);
        if !turn.polling.load(Ordering::SeqCst) {
            turn.task.wake();
        }
    }
}

impl<F: Future> Future for SelfWakes<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let mut this = self.project();
        this.turn.task.register(cx.waker());
        let mut inner = Context::from_waker(this.waker);
        for _ in 0..TURNS {
            this.turn.polling.store(true, Ordering::SeqCst);
            this.turn.woken.store(false, Ordering::SeqCst);
            let polled = this.future.as_mut().poll(&mut inner);
            this.turn.polling.store(false, Ordering::SeqCst);
            if let Poll::Ready(output) = polled {
                // Wakes that come after the end go nowhere.
                drop(this.turn.task.take());
                return Poll::Ready(output);
            }
            if !this.turn.woken.load(Ordering::SeqCst) {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::atomic::AtomicUsize,
        task::{Wake, Waker},
        time::Duration,
    };

    use super::*;

    /// Counts the wakes the task gets.
    #[derive(Default)]
    struct CountingTask(AtomicUsize);

    impl Wake for CountingTask {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A future that wakes itself `times` times, each while polled, then
    /// is done; it counts its polls.
    struct WakesItself {
        times: usize,
        polls: usize,
    }

    impl Future for WakesItself {
        type Output = usize;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.polls > self.times {
                return Poll::Ready(self.polls);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    fn poll_once<F: Future + Unpin>(future: &mut F, task: &Arc<CountingTask>) -> Poll<F::Output> {
        let waker = Waker::from(Arc::clone(task));
        Pin::new(future).poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn a_wake_given_while_polled_is_taken_in_the_same_poll() {
        let task = Arc::new(CountingTask::default());
        let mut future = self_wakes(WakesItself { times: 3, polls: 0 });
        assert_eq!(poll_once(&mut future, &task), Poll::Ready(4));
        assert_eq!(task.0.load(Ordering::SeqCst), 0, "the task was not woken");
        // Without the wrapper, the same future wakes its task.
        let mut bare = WakesItself { times: 3, polls: 0 };
        assert_eq!(poll_once(&mut bare, &task), Poll::Pending);
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_future_that_keeps_waking_itself_still_yields() {
        let task = Arc::new(CountingTask::default());
        let mut future = self_wakes(WakesItself {
            times: usize::MAX,
            polls: 0,
        });
        assert_eq!(poll_once(&mut future, &task), Poll::Pending);
        assert_eq!(future.future.polls, TURNS);
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "yielded as a task would");
    }

    #[tokio::test]
    async fn a_wake_from_elsewhere_reaches_the_task() {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let waiting = tokio::spawn(self_wakes(receiver));
        tokio::time::sleep(Duration::from_millis(10)).await;
        sender.send(7).unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), waiting).await;
        assert_eq!(got.unwrap().unwrap(), Ok(7));
    }
}
