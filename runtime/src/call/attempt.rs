//! One attempt (the decision table in `docs/rules.md`, step 3): the body run under its timeout (or with its lease kept alive), its
//! outcome classified, and what follows from the class — a retry after a backoff, a lookup, a release,
//! a record.
//!
//! # Guarantees
//!
//! * Every attempt carries the call's callId; a retry is sent only after its backoff and only once
//!   the lease, extended over the wait, confirms under the fence that the key is still this call's.
//! * An uncertain outcome (a timeout, `Unknown`) is never retried blindly: it is asked by callId, or
//!   retried with the same callId under `on_unknown = "rerun"`, or left `UNKNOWN` under `"hold"`.
//! * After an uncertain attempt, a refusal is never given back: it is asked about (with a `lookup`),
//!   or recorded `FAILED`.
//! * Retries draw on the dependency's retry budget; a spent budget, a `retry_after` past
//!   `max_retry_after` or spent retries end the call as exhaustion does (`give_up.rs`).

use std::future::Future;
use std::pin::{pin, Pin};
use std::time::Duration;

use crate::classify::ErrorClass;
use crate::clock::ms;
use crate::context::{AttemptTime, Context};
use crate::error::{Error, StoreError};
use crate::journal::{AttemptOutcome, EventKind};
use crate::lease::Owner;
use crate::observe::metrics::RetryClass;
use crate::observe::Counter;
use crate::receipt::Fence;

use super::{Call, CallResult, OnUnknown, Phase, Step};

impl<T, E> Call<T, E> {
    pub(super) async fn attempt<F, O>(&mut self, body: F) -> Step<T, E>
    where
        F: Future<Output = O>,
        O: CallResult<Ok = T, Err = E>,
    {
        self.tally.attempts += 1;
        self.tally.refused = false;
        self.count(Counter::Attempts);
        // From here until the body returns, a call dropped may have taken effect (a plain run holds
        // no claim: nothing to mark).
        let just_claimed = match self.phase {
            Phase::JustClaimed(fence) => {
                self.phase = Phase::Attempting(fence);
                true
            }
            Phase::Owner(fence) => {
                self.phase = Phase::Attempting(fence);
                false
            }
            _ => false,
        };
        call_event!(DEBUG, self; "attempt");
        // An attempt that follows a claim answered at once (nothing awaited between them, in the
        // generated code or here) is stamped with the claim's reading of the clock, taken a few hundred
        // nanoseconds before (readings are in milliseconds): one read fewer. Any other attempt reads
        // the clock.
        let started = if just_claimed {
            self.times.claimed_ms
        } else {
            self.rt.now_ms()
        };
        self.place.round = self.place.dependency.limiter.round();
        if self.tally.attempts == 1 && !self.plain {
            // A call that sends: it adds to the retries and lookups its dependency may make.
            self.place.dependency.retries.deposit(started);
            self.rt.lookup_budget().deposit(started);
        }
        let context = Context::new(
            self.ids.call_id.clone(),
            self.ids.trace,
            self.ids.key.clone(),
            self.tally.attempts,
            self.phase.fence().unwrap_or(Fence(0)),
            AttemptTime {
                started_ms: started,
                ttl_ms: ms(self.spec.ttl),
                clock: self.rt.clock().clone(),
            },
        )
        .holding(if self.place.admitted {
            self.place.enclosing.with(self.limiter_addr())
        } else {
            self.place.enclosing
        });
        let context = if self.plain {
            context.unprotected()
        } else {
            context
        };
        let body = context.scope(body);
        let outcome = match self.spec.timeout {
            // The lease already covers the whole timeout.
            Some(limit) => tokio::time::timeout(limit, body).await.ok(),
            None => Some(self.heartbeat(pin!(body)).await),
        }
        .map(CallResult::into_result);
        // The body returned, but the call stays `Attempting` until its outcome is classified and
        // either written or found to be one where nothing took effect: a panic in the user's
        // `Classify`, `Display` or `Serialize` — or the caller going away — between the two leaves
        // the call `UNKNOWN` for compensation, never a released key whose request took effect.
        if self.plain {
            // No claim, no receipt: the body's answer is the call's, and a timeout stays unknown.
            return match outcome {
                Some(out) => self.done(out),
                None => {
                    let call_id = self.ids.call_id.clone();
                    self.fail_with(Error::Unknown { call_id })
                }
            };
        }
        let attempt = |outcome, error| EventKind::Attempt {
            attempt: self.tally.attempts,
            started_ms: started,
            outcome,
            error,
        };
        match outcome {
            None => {
                call_event!(INFO, self; "attempt timed out; outcome unknown");
                self.tally.last_outcome = Some(AttemptOutcome::TimedOut);
                self.note(attempt(AttemptOutcome::TimedOut, None));
                Box::pin(self.unknown_outcome(None)).await
            }
            Some(Ok(value)) => {
                if let Some(limit) = self.place.dependency.limiter.succeeded() {
                    crate::observe::metrics::concurrency_limit(&self.place.dependency.name, limit);
                }
                if self.worth_journaling() {
                    self.note(attempt(AttemptOutcome::Ok, None));
                }
                self.succeed(value).await
            }
            Some(Err(error)) => {
                let class = (self.codec.classify)(&error);
                let described = self.codec.errors.describe(&error);
                self.tally.last_outcome = Some(class.into());
                self.note(attempt(class.into(), Some(described)));
                call_event!(DEBUG, self; class = ?class, "attempt failed");
                match class {
                    // After an uncertain attempt, a refusal may only mean "you already did that": the
                    // call's outcome is the earlier attempt's, so ask the receipt instead of recording
                    // FAILED. (With `rerun` the remote dedups by callId, so its answer is the call's.)
                    ErrorClass::Permanent | ErrorClass::Rejected
                        if self.tally.uncertain && self.has_lookup =>
                    {
                        self.tally.refused = true;
                        Box::pin(self.unknown_outcome(Some(error))).await
                    }
                    ErrorClass::Permanent => Box::pin(self.fail(error)).await,
                    // Nothing took effect by this attempt, but an earlier one may have: the refusal
                    // may answer it, so it is recorded rather than given back.
                    ErrorClass::Rejected if self.tally.uncertain => {
                        Box::pin(self.fail(error)).await
                    }
                    ErrorClass::Rejected => {
                        self.tally.last_error = Some(error);
                        self.nothing_took_effect();
                        Box::pin(self.give_back("rejected; nothing took effect")).await
                    }
                    ErrorClass::Retryable => {
                        self.tally.last_error = Some(error);
                        self.nothing_took_effect();
                        Box::pin(self.retry(RetryClass::Retryable, Duration::ZERO)).await
                    }
                    ErrorClass::RateLimited { retry_after } => {
                        self.tally.last_error = Some(error);
                        self.nothing_took_effect();
                        if let Some(limit) =
                            self.place.dependency.limiter.rate_limited(self.place.round)
                        {
                            call_event!(INFO, self; dependency = %self.place.dependency.name, limit,
                                "rate limited: fewer calls in flight");
                            crate::observe::metrics::concurrency_limit(
                                &self.place.dependency.name,
                                Some(limit),
                            );
                        }
                        Box::pin(self.retry(
                            RetryClass::RateLimited,
                            retry_after.unwrap_or(Duration::ZERO),
                        ))
                        .await
                    }
                    ErrorClass::Unknown => Box::pin(self.unknown_outcome(Some(error))).await,
                }
            }
        }
    }

    /// Awaits an attempt that has no timeout, its lease kept alive for as long as it runs
    /// ([`crate::lease`]), so that a slow body is never taken for a dead one.
    pub(super) async fn heartbeat<F: Future>(&mut self, body: Pin<&mut F>) -> F::Output {
        let Some(fence) = self.phase.fence() else {
            return body.await;
        };
        let owner = Owner {
            rt: &self.rt,
            key: &self.ids.key,
            call_id: &self.ids.call_id,
            fence,
            lease: self.lease(),
            attempt: self.tally.attempts,
        };
        owner.keep_alive(body).await
    }

    /// Extends this call's claim to cover `wait` and then one more lease.
    pub(super) async fn extend_lease(&self, wait: Duration) -> Result<(), StoreError> {
        let Some(fence) = self.phase.fence() else {
            return Ok(());
        };
        let lease = ms(wait.saturating_add(self.lease()));
        self.rt
            .store()
            .extend_lease(&self.ids.key, fence, lease, self.rt.now_ms())
            .await
    }

    /// Extends the claim over a wait and the attempt after it. A refusal means another owner holds the
    /// key now ([`Call::fenced_out`]); a failing store ends the call as [`Call::exhausted`] does.
    pub(super) async fn hold_lease(&mut self, wait: Duration) -> Result<(), Step<T, E>> {
        match self.extend_lease(wait).await {
            Ok(()) => Ok(()),
            Err(e) if e.lost_key() => {
                call_event!(WARN, self; error = %e, "lease refused: another owner holds the key");
                Err(self.fenced_out(None).await)
            }
            Err(e) => {
                call_event!(WARN, self; error = %e, "could not extend the lease; stopping");
                Err(self.exhausted().await)
            }
        }
    }

    /// The attempt's outcome says its request did not take effect: the call owns the key between
    /// attempts again, and a caller that goes away now leaves it to be given back (unless an earlier
    /// attempt was uncertain).
    fn nothing_took_effect(&mut self) {
        if let Phase::Attempting(fence) = self.phase {
            self.phase = Phase::Owner(fence);
        }
    }

    pub(super) async fn unknown_outcome(&mut self, error: Option<E>) -> Step<T, E> {
        self.tally.uncertain = true;
        // Uncertain from here on: whatever the phase, the drop guard leaves the call `UNKNOWN`.
        if let Phase::Attempting(fence) = self.phase {
            self.phase = Phase::Owner(fence);
        }
        if error.is_some() {
            self.tally.last_error = error;
        }
        if self.has_lookup {
            self.tally.lookups_processing = 0;
            call_event!(DEBUG, self; "asking the receipt");
            return Step::Lookup(self.ids.call_id.clone());
        }
        match self.spec.on_unknown {
            OnUnknown::Rerun => self.retry(RetryClass::Unknown, Duration::ZERO).await,
            OnUnknown::Hold => {
                let now = self.rt.now_ms();
                self.give_up_unknown("outcome unknown and no lookup to ask", now)
                    .await
            }
        }
    }

    /// Backs off and asks for another attempt, or gives up when the retries are spent. The wait is at
    /// least `at_least` (a rate limit's `retry_after`); one longer than the runtime's
    /// [`max_retry_after`](crate::runtime::RuntimeBuilder::max_retry_after) ends the call instead.
    pub(super) async fn retry(&mut self, class: RetryClass, at_least: Duration) -> Step<T, E> {
        if self.spent() > self.tally.retries {
            return self.exhausted().await;
        }
        let now = self.rt.now_ms();
        if !self.place.dependency.retries.withdraw(now) {
            self.count(Counter::BudgetSpent);
            let spec = self.spec;
            spec.metrics
                .budget_spent(spec.scope, spec.budget_name(), false);
            call_event!(WARN, self; budget = self.spec.budget.unwrap_or("runtime"),
                "retry budget spent: no retry");
            return self.exhausted().await;
        }
        if at_least > self.rt.max_retry_after() {
            call_event!(INFO, self; retry_after_ms = ms(at_least),
                max_retry_after_ms = ms(self.rt.max_retry_after()),
                "retry-after beyond max_retry_after; stopping");
            return self.exhausted().await;
        }
        let delay = self
            .spec
            .backoff()
            .delay(self.tally.attempts - 1, &mut self.tally.rng)
            .max(at_least);
        if let Err(step) = self.hold_lease(delay).await {
            return step;
        }
        self.count(Counter::Retries);
        let spec = self.spec;
        spec.metrics.retry(spec.scope, spec.budget_name(), class);
        call_event!(DEBUG, self; delay_ms = ms(delay), "backing off");
        self.back_off(delay).await;
        // The sleep is where an owner stalls past its lease: confirm, under the fence, that the key is
        // still this call's before anything is sent again.
        if let Err(step) = self.hold_lease(Duration::ZERO).await {
            return step;
        }
        Step::Attempt
    }

    /// Journals a backoff and waits it out, writing the journal meanwhile (the write costs the call
    /// no time unless it outlasts the wait).
    pub(super) async fn back_off(&mut self, delay: Duration) {
        self.note(EventKind::Backoff {
            attempt: self.tally.attempts,
            delay_ms: ms(delay),
        });
        tokio::join!(self.flush(), tokio::time::sleep(delay));
    }

    /// Attempts sent and lookups failed: what the call's retries are spent on.
    pub(super) fn spent(&self) -> u32 {
        self.tally
            .attempts
            .saturating_add(self.tally.lookups_failed)
    }
}
