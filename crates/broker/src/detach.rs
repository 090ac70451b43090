//! A call that finishes even if its caller goes away, without a task of its
//! own while the caller stays.
//!
//! `tokio::spawn` and awaiting the handle would do the same, but costs a
//! task hop each way, and on two worker threads a hop often wakes the other
//! thread for nothing. Here the caller polls the call itself; only if the
//! caller is dropped first (an HTTP client that disconnects) does the rest
//! of the call move to a task of its own, so it still completes and is
//! audited.

use std::{
    any::Any,
    future::Future,
    panic::{AssertUnwindSafe, catch_unwind},
    pin::Pin,
    task::{Context, Poll},
};

/// The call, boxed by the caller where it is built: a call's future is
/// tens of kilobytes, and every move of it by value is a copy that size.
pub(crate) type Work<T> = Pin<Box<dyn Future<Output = T> + Send>>;

pub(crate) struct Detached<T: Send + 'static> {
    work: Option<Work<T>>,
}

impl<T: Send + 'static> Detached<T> {
    /// A panic in `work` comes out as an error, as from a task's handle.
    pub(crate) fn new(work: Work<T>) -> Self {
        Detached { work: Some(work) }
    }
}

impl<T: Send + 'static> Future for Detached<T> {
    type Output = Result<T, Box<dyn Any + Send>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let work = self.work.as_mut().expect("polled after it finished");
        let done = match catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx))) {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(done)) => Ok(done),
            Err(panic) => Err(panic),
        };
        self.work = None;
        Poll::Ready(done)
    }
}

impl<T: Send + 'static> Drop for Detached<T> {
    fn drop(&mut self) {
        if let Some(work) = self.work.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            // The task catches a panic of its own.
            runtime.spawn(async move {
                let _ = work.await;
            });
        }
    }
}

/// What a panic said, as a task's `JoinError` would show it.
pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> String {
    let said = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str));
    match said {
        Some(said) => format!("it panicked with message {said:?}"),
        None => "it panicked".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use tokio::sync::Notify;

    use super::*;

    #[tokio::test]
    async fn a_dropped_caller_leaves_the_work_running_to_the_end() {
        let (started, finished) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let work = {
            let (started, finished) = (Arc::clone(&started), Arc::clone(&finished));
            async move {
                started.notify_one();
                tokio::time::sleep(Duration::from_millis(20)).await;
                finished.notify_one();
            }
        };
        let caller = tokio::spawn(Detached::new(Box::pin(work)));
        started.notified().await;
        caller.abort();
        tokio::time::timeout(Duration::from_secs(5), finished.notified())
            .await
            .expect("the work went on after its caller was dropped");
    }

    #[tokio::test]
    async fn a_panic_is_an_error_not_the_callers_panic() {
        let done = Detached::new(Box::pin(async { panic!("in the call") })).await;
        let panic = done.expect_err("a panic is an error");
        assert_eq!(
            panic_message(&*panic),
            "it panicked with message \"in the call\""
        );
        assert_eq!(Detached::new(Box::pin(async { 7 })).await.unwrap(), 7);
    }
}
