//! Lookup and resolve (the decision table in `docs/rules.md`, steps 2 and 3, `Unknown`): the receipt asked by callId, under a time
//! limit and the lookup budget, and the call continued from its answer.
//!
//! # Guarantees
//!
//! * Only "not received" lets the call send again, with the same callId, and only once it confirmed
//!   under its fence that the key is still its own (a retry confirms after its backoff); after a
//!   refusal, it makes the refusal the answer (recorded `FAILED`), never a release.
//! * A lookup holds the lease over its own time limit; "processing" is asked again a bounded number
//!   of times; a failed lookup is asked again while retries last, each failure using one; a spent
//!   lookup budget leaves the outcome `UNKNOWN`.

use std::future::Future;
use std::time::Duration;

use crate::classify::RemoteStatus;
use crate::clock::ms;
use crate::journal::{EventKind, LookupOutcome};
use crate::observe::metrics::RetryClass;
use crate::observe::Counter;

use super::{Call, LookupAnswer, Step};

/// How long a `lookup` may take when the function has no `timeout`; past it, the lookup has failed.
const LOOKUP_LIMIT: Duration = Duration::from_secs(10);

impl<T, E> Call<T, E> {
    pub(super) async fn resolve<F>(&mut self, lookup: F) -> Step<T, E>
    where
        F: Future,
        F::Output: LookupAnswer<T, E>,
    {
        let now = self.rt.now_ms();
        if !self.rt.lookup_budget().withdraw(now) {
            self.count(Counter::BudgetSpent);
            let spec = self.spec;
            spec.metrics
                .budget_spent(spec.scope, spec.budget_name(), true);
            call_event!(WARN, self; "lookup budget spent: outcome left unknown");
            return self.give_up_unknown("lookup budget spent", now).await;
        }
        self.count(Counter::Lookups);
        let limit = self.spec.timeout.unwrap_or(LOOKUP_LIMIT);
        if let Err(step) = self.hold_lease(limit).await {
            return step;
        }
        let answer = match tokio::time::timeout(limit, lookup).await {
            Ok(answer) => answer.into_answer(),
            Err(_) => Err(format!("no answer within {limit:?}")),
        };
        let now = self.rt.now_ms();
        let (seen, error) = match &answer {
            Ok(RemoteStatus::Succeeded(_)) => (LookupOutcome::Succeeded, None),
            Ok(RemoteStatus::Failed(_)) => (LookupOutcome::Failed, None),
            Ok(RemoteStatus::NotReceived) => (LookupOutcome::NotReceived, None),
            Ok(RemoteStatus::Processing) => (LookupOutcome::Processing, None),
            Err(e) => (LookupOutcome::NoAnswer, Some(e.clone())),
        };
        self.note(EventKind::Lookup {
            answer: seen,
            error,
        });
        self.spec.metrics.lookup(
            self.spec.scope,
            self.spec.budget_name(),
            match seen {
                LookupOutcome::Succeeded => "succeeded",
                LookupOutcome::Failed => "failed",
                LookupOutcome::NotReceived => "not_received",
                LookupOutcome::Processing => "processing",
                LookupOutcome::NoAnswer => "no_answer",
            },
        );
        match answer {
            Ok(RemoteStatus::Succeeded(value)) => {
                call_event!(INFO, self; "lookup: succeeded");
                self.succeed(value).await
            }
            Ok(RemoteStatus::Failed(error)) => {
                call_event!(INFO, self; "lookup: failed");
                self.fail(error).await
            }
            Ok(RemoteStatus::NotReceived) => {
                call_event!(INFO, self; "lookup: not received");
                // The receipt covers the callId, so every attempt so far: none of them arrived (yet):
                // a retry with the same callId is safe, the remote dedups a late arrival by it. But
                // after a refusal, nothing took effect and the refusal is the remote's answer: it is
                // recorded (never given back: the first request may still arrive), not sent again.
                if self.tally.refused {
                    if let Some(error) = self.tally.last_error.take() {
                        self.tally.refused = false;
                        return self.fail(error).await;
                    }
                }
                if self.tally.attempts == 0 {
                    // The wait for the answer is where a taker stalls past its lease (a GC pause, a
                    // blocked thread) while another takes the call over and sends: confirm, under
                    // the fence, that the key is still this call's before anything is sent.
                    if let Err(step) = self.hold_lease(Duration::ZERO).await {
                        return step;
                    }
                    Step::Attempt
                } else {
                    self.retry(RetryClass::Unknown, Duration::ZERO).await
                }
            }
            Ok(RemoteStatus::Processing) => {
                self.tally.lookups_processing += 1;
                call_event!(INFO, self; polls = self.tally.lookups_processing, "lookup: processing");
                if self.tally.lookups_processing > self.rt.lookup_polls() {
                    return self
                        .give_up_unknown("remote still processing after every lookup", now)
                        .await;
                }
                let delay = self
                    .spec
                    .backoff()
                    .delay(self.tally.lookups_processing - 1, &mut self.tally.rng);
                if let Err(step) = self.hold_lease(delay).await {
                    return step;
                }
                self.back_off(delay).await;
                Step::Lookup(self.ids.call_id.clone())
            }
            Err(e) => {
                // Asking again re-sends nothing, so a failed lookup is asked again after a backoff, as
                // long as the call has retries left; each failed lookup uses one up.
                self.tally.lookups_failed += 1;
                if self.spent() > self.tally.retries {
                    call_event!(WARN, self; error = %e, failed_lookups = self.tally.lookups_failed,
                        "lookup failed and no retry is left; outcome stays unknown");
                    return self
                        .give_up_unknown(&format!("receipt lookup failed: {e}"), now)
                        .await;
                }
                let delay = self
                    .spec
                    .backoff()
                    .delay(self.tally.lookups_failed - 1, &mut self.tally.rng);
                call_event!(INFO, self; error = %e, failed_lookups = self.tally.lookups_failed,
                    delay_ms = ms(delay), "lookup failed; asking again");
                if let Err(step) = self.hold_lease(delay).await {
                    return step;
                }
                self.back_off(delay).await;
                Step::Lookup(self.ids.call_id.clone())
            }
        }
    }

    pub(super) async fn no_lookup(&mut self) -> Step<T, E> {
        let now = self.rt.now_ms();
        self.give_up_unknown("outcome unknown and no lookup to ask", now)
            .await
    }
}
