//! Keeping an owner's lease alive while something that may act runs under it: a call's attempt, a
//! compensation worker's reversal or re-run.
//!
//! # Guarantees
//!
//! * While the work runs, the lease is extended (fenced) every third of it, so a slow body or reversal
//!   is never taken for a dead owner and its key never taken over by a duplicate that would act too.
//! * A refused extension (another owner took the key: this one stalled past its lease) does not stop
//!   the work — stopping would not undo what it already sent — and its later writes are fenced out.
//! * The renewals run beside the work: the work is polled while a renewal waits for the store, so a
//!   renewal never waits on a lock the work itself holds, and a slow renewal never slows the work.
//! * The first poll takes no timer: work that finishes at once costs nothing more.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use crate::call_id::CallId;
use crate::clock::ms;
use crate::key::Key;
use crate::receipt::Fence;
use crate::runtime::Runtime;

/// The owner of a key: what renewing its lease needs.
pub(crate) struct Owner<'a> {
    pub(crate) rt: &'a Runtime,
    pub(crate) key: &'a Key,
    pub(crate) call_id: &'a CallId,
    pub(crate) fence: Fence,
    /// How long each extension holds the key from the moment it is made.
    pub(crate) lease: Duration,
    /// The attempt running under it, for the traces (0: not an attempt of the call).
    pub(crate) attempt: u32,
}

impl Owner<'_> {
    /// Awaits `work`, extending the lease every third of it for as long as it runs.
    pub(crate) async fn keep_alive<F: Future>(&self, mut work: Pin<&mut F>) -> F::Output {
        if let Poll::Ready(out) = poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await {
            return out;
        }
        // Work still running after its first poll: its timer lives in a box, not in every caller's
        // future.
        Box::pin(self.beat(work)).await
    }

    async fn beat<F: Future>(&self, mut work: Pin<&mut F>) -> F::Output {
        // At least a millisecond: a lease of zero would renew in a busy loop.
        let beat = (self.lease / 3).max(Duration::from_millis(1));
        // The renewals run beside the work, never instead of it: the work is polled while a renewal
        // waits for the store — a renewal that waits on a row lock the work's own transaction holds
        // (`complete_in` before its `COMMIT`) would otherwise wait for ever, and a slow renewal
        // would freeze the work for as long as it takes.
        // Each renewal has a beat to end: one that never answers (a stuck connection) is dropped
        // and the next beat tries again, rather than the lease lapsing under work that runs on.
        let renewals = async {
            loop {
                tokio::time::sleep(beat).await;
                if tokio::time::timeout(beat, self.renew()).await.is_err() {
                    tracing::warn!(target: "samekey", call_id = %self.call_id,
                        key = %self.key.short(), attempt = self.attempt, fence = self.fence.0,
                        "a lease renewal did not end within its beat; trying again");
                }
            }
        };
        tokio::select! {
            biased;
            out = &mut work => out,
            never = renewals => never,
        }
    }

    /// Extends the lease to one more `lease` from now; a refusal or failure is logged.
    pub(crate) async fn renew(&self) {
        let renewed = self
            .rt
            .store()
            .extend_lease(self.key, self.fence, ms(self.lease), self.rt.now_ms())
            .await;
        if let Err(e) = renewed {
            tracing::error!(target: "samekey", call_id = %self.call_id, key = %self.key.short(),
                attempt = self.attempt, fence = self.fence.0, error = %e,
                "could not renew the lease of work that is running under it");
        }
    }
}
