//! The [`TestKit::call`](super::TestKit::call) a request is sent under, read by the remote that
//! answers it (which call sent it, and how a [`Fault::Crash`](super::Fault::Crash) drops its caller).

use std::future::Future;
use std::sync::Arc;

use tokio::sync::Notify;

tokio::task_local! {
    static CALLER: CallScope;
}

/// The [`TestKit::call`](super::TestKit::call) a request is sent under: its number, and how a
/// [`Fault::Crash`](super::Fault::Crash) drops it.
#[derive(Clone)]
pub(crate) struct CallScope {
    number: u64,
    crashed: Arc<Notify>,
}

impl CallScope {
    pub(crate) fn new(number: u64) -> CallScope {
        CallScope {
            number,
            crashed: Arc::new(Notify::new()),
        }
    }

    /// The scope of the call running on this task, if any.
    pub(crate) fn current() -> Option<CallScope> {
        CALLER.try_with(Clone::clone).ok()
    }

    /// Runs `fut` as this call.
    pub(crate) async fn enter<F: Future>(self, fut: F) -> F::Output {
        CALLER.scope(self, fut).await
    }

    pub(crate) fn number(&self) -> u64 {
        self.number
    }

    /// Notified when a fault crashes this call's caller.
    pub(crate) fn crashed(&self) -> Arc<Notify> {
        self.crashed.clone()
    }

    pub(crate) fn crash(&self) {
        self.crashed.notify_one();
    }
}
