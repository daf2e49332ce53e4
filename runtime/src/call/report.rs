//! What every step writes down and how the call answers: counters and metrics, the journal's pending
//! events, the observer's report.
//!
//! # Guarantees
//!
//! * A call that its first attempt settles writes no journal events (its receipt tells the story);
//!   the first event of a run that claimed its key brings the claim with it.
//! * A journal the store fails to take costs the call a warning, never its answer.

use crate::clock::ms;
use crate::error::{Error, StoreError};
use crate::journal::{Event, EventKind};
use crate::observe::Counter;
use crate::observe::{CallAnswer, CallReport};

use super::{Call, Observer, Phase, Step};

impl<T, E> Call<T, E> {
    /// Whether this call's story is more than its receipt tells: more than one attempt, a lookup,
    /// an uncertain outcome, a take-over, or something journaled already.
    pub(super) fn worth_journaling(&self) -> bool {
        self.trail.journaled
            || self.tally.attempts > 1
            || self.tally.took_over
            || self.tally.uncertain
            || self.tally.lookups_failed > 0
    }

    /// Adds an event to the journal (written by the next [`Call::flush`]); the first one of a run
    /// that claimed its key brings the claim with it.
    pub(super) fn note(&mut self, what: EventKind) {
        if self.trail.journal.is_empty() && !self.trail.journaled && !self.tally.took_over {
            let claimed = EventKind::Claimed {
                fence: self.phase.fence().map_or(0, |f| f.0),
            };
            let event = self.event(self.times.claimed_ms, claimed);
            self.trail.journal.push(event);
        }
        let event = self.event(self.rt.now_ms(), what);
        self.trail.journal.push(event);
    }

    pub(super) fn event(&self, at_ms: u64, what: EventKind) -> Event {
        Event {
            call_id: self.ids.call_id.clone(),
            at_ms,
            node: self.rt.node().to_owned(),
            what,
        }
    }

    /// Writes the journal's pending events. A store that fails to take them costs the call nothing but
    /// a warning: the journal is what an operator reads, not what decides the call.
    pub(super) async fn flush(&mut self) {
        if self.trail.journal.is_empty() {
            return;
        }
        let events = std::mem::take(&mut self.trail.journal);
        self.trail.journaled = true;
        let keep = ms(self.spec.ttl);
        let written = self
            .rt
            .store()
            .append_journal(&self.ids.key, &events, keep, self.rt.now_ms())
            .await;
        if let Err(e) = written {
            call_event!(WARN, self;
                error = %e, events = events.len(), "could not write the call's journal");
        }
    }

    /// Counts `counter` in the runtime's stats and, as `scope`'s, in the metrics.
    pub(super) fn count(&self, counter: Counter) {
        self.rt.count(counter);
        if !matches!(
            counter,
            Counter::Lookups | Counter::BudgetSpent | Counter::Retries
        ) {
            let spec = self.spec;
            spec.metrics.count(counter, spec.scope, spec.budget_name());
        }
    }

    pub(super) fn done(&mut self, out: Result<T, E>) -> Step<T, E> {
        self.phase = Phase::Free;
        let spec = self.spec;
        spec.metrics.call(
            spec.scope,
            spec.budget_name(),
            out.is_ok(),
            &self.times.took,
            self.tally.attempts,
        );
        if let Some(observer) = self.observer.take() {
            let Observer { slot, replayed } = *observer;
            let answer = if replayed.is_some() {
                CallAnswer::Replayed
            } else if self.plain {
                CallAnswer::Unprotected
            } else if self.tally.attempts == 0 && !self.tally.took_over {
                CallAnswer::Refused
            } else {
                CallAnswer::Executed
            };
            slot.report(CallReport {
                call_id: replayed.unwrap_or_else(|| self.ids.call_id.clone()),
                trace_id: self.ids.trace.trace_id(),
                key: self.ids.key.clone(),
                answer,
                attempts: self.tally.attempts,
            });
        }
        Step::Done(out)
    }

    pub(super) fn fail_with(&mut self, error: Error) -> Step<T, E> {
        let error = (self.codec.from_error)(error);
        self.done(Err(error))
    }

    pub(super) fn store_failed(&mut self, e: StoreError) -> Step<T, E> {
        self.count(Counter::FailedClosed);
        crate::observe::metrics::store_error(self.rt.store().kind());
        call_event!(WARN, self; error = %e, "store failed; failing closed");
        self.fail_with(Error::Store(e))
    }
}
