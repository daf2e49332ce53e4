//! Begin and claim (the decision table in `docs/rules.md`, step 1): the key and the callId fixed once, a replay answered in process
//! when it can be, the call's place in its dependency's concurrency limit, and the claim — with a
//! claim whose answer never came handed to [`crate::unanswered`].
//!
//! # Guarantees
//!
//! * The key and the callId are made once, here, before anything is claimed or sent.
//! * Nothing is claimed for a key that does not name the operation (a part missing or refused, a
//!   default scope that clashes), and nothing runs without a claim, unless the function opted in to
//!   run once unprotected (`on_missing_key = "run"`).
//! * A claim the store fails on fails the call closed; one whose answer never came is given back only
//!   under the call's own, not adopted, callId; one answered as existing although this call sent it
//!   is owned under its fence, its lease renewed first.
//! * The in-process replay answers exactly what the claim would have (a finished `SUCCESS`, its
//!   `verify` fingerprint matching), counted the same way; anything else takes the whole way.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::clock::ms;
use crate::codec::{ErrorCodec, Keeper};
use crate::context::{self};
use crate::error::Error;
use crate::key::{Fingerprint, Key, KeyBuilder, KeyProblem};
use crate::observe::metrics::Stopwatch;
use crate::observe::Counter;
use crate::observe::Slot;
use crate::receipt::Receipt;
use crate::runtime::Runtime;
use crate::scope;
use crate::store::{Claim, Claimed, StoreClock};
use crate::unanswered::{self, Unanswered};

use super::held::Held;
use super::{
    Admission, Begun, Call, CallError, CallOutput, Codec, Ids, Observer, OnMissingKey, Phase, Run,
    Spec, Step, Tally, Times, Trail,
};

/// The body of [`begin`](fn@super::begin), inlined into it (its one caller): the bounds are checked
/// there, once, with the message a user reads.
#[inline(always)]
pub(super) fn begin<T: CallOutput, E: CallError>(
    rt: Option<&Runtime>,
    spec: &'static Spec,
    self_type: &'static str,
    mut key: KeyBuilder,
    verify: Option<KeyBuilder>,
    errors: ErrorCodec<E>,
    values: Option<Keeper<T>>,
) -> Begun<T, E> {
    // Borrowed until the call needs its own (a replay answered in process never does).
    let rt: Cow<'_, Runtime> = match rt {
        Some(rt) => Cow::Borrowed(rt),
        None => Cow::Owned(crate::runtime::ambient_runtime()),
    };
    let took = Stopwatch::start();
    // A window needs the time before the key is done; a call without one reads it after a replay
    // has been ruled out (a replay reads the coarse clock: `replay_in_process`).
    let windowed = spec.window.map(|window| {
        let now = rt.now_ms();
        key.window(u64::try_from(window.as_millis()).unwrap_or(u64::MAX), now);
        now
    });
    rt.count(Counter::Calls);
    spec.metrics
        .count(Counter::Calls, spec.scope, spec.budget_name());
    let problem = key
        .problem()
        .or_else(|| verify.as_ref().and_then(KeyBuilder::problem))
        .cloned()
        .map(Box::new);
    let key = key.finish();
    let fingerprint = verify.map(KeyBuilder::fingerprint);
    if problem.is_none() {
        let replayed = replay_in_process(
            &rt,
            spec,
            self_type,
            &key,
            fingerprint,
            windowed,
            &took,
            values,
        );
        if let Some(out) = replayed {
            return Begun::Answered(out);
        }
    }
    let now = windowed.unwrap_or_else(|| rt.now_ms());
    let context::Identity {
        call_id,
        trace,
        adopted,
        places,
    } = context::identify(spec.prefix, rt.node_label(), now);
    let rng = rt.jitter_seed(&call_id);
    let dependency = rt.dependency(spec.budget);
    Begun::Run(Run(Call {
        rt: rt.into_owned(),
        spec,
        ids: Ids {
            key,
            call_id,
            trace,
            fingerprint,
            adopted,
            inputs: None,
        },
        phase: Phase::Free,
        tally: Tally {
            took_over: false,
            attempts: 0,
            retries: spec.retries,
            uncertain: false,
            last_error: None,
            last_outcome: None,
            lookups_processing: 0,
            lookups_failed: 0,
            waited: Duration::ZERO,
            refused: false,
            rng,
        },
        times: Times {
            began_ms: now,
            took,
            claimed_ms: now,
        },
        trail: Trail {
            journal: Vec::new(),
            journaled: false,
        },
        place: Admission {
            dependency,
            admitted: false,
            enclosing: places,
            round: 0,
        },
        self_type,
        codec: Codec::new(errors),
        problem,
        plain: false,
        has_lookup: spec.has_lookup,
        observer: Slot::take().map(|slot| {
            Box::new(Observer {
                slot,
                replayed: None,
            })
        }),
    }))
}

/// Answers a duplicate before anything else is made for it — no callId, no place in a concurrency
/// limit, no claim — when the runtime's store is the in-process one and holds the key's finished
/// `SUCCESS` receipt: what [`Call::start`] would answer, counted the same way. Anything else goes
/// the whole way: no such receipt, a stored failure, a `verify` mismatch, a result that does not
/// decode, an [`observed`](crate::observe::observed) call, a rate-limited dependency, an inbound callId
/// waiting to be adopted, a scope clash, and debug tracing on (the whole way logs the replay).
///
/// With a `keeper` (a `Clone` value type), the first such replay keeps the decoded value beside the
/// receipt and later ones clone it instead of decoding the JSON again.
///
/// `#[inline]`: its one caller, [`begin`](fn@super::begin), is made in another codegen unit since the
/// two live in different modules, and a replay is the path where the call itself costs most.
#[inline]
#[allow(clippy::too_many_arguments)]
fn replay_in_process<T: CallOutput, E>(
    rt: &Runtime,
    spec: &'static Spec,
    self_type: &'static str,
    key: &Key,
    fingerprint: Option<Fingerprint>,
    now: Option<u64>,
    took: &Stopwatch,
    keeper: Option<Keeper<T>>,
) -> Option<Result<T, E>> {
    let memory = rt.memory()?;
    if tracing::enabled!(target: "samekey", tracing::Level::DEBUG)
        || Slot::any()
        || context::inbound_pending()
        || rt.limited(spec.budget)
    {
        return None;
    }
    if !spec.scope_given {
        let addr = std::ptr::from_ref(spec) as usize;
        scope::check(&spec.operation, addr, spec.scope, spec.name, self_type).ok()?;
    }
    // The coarse clock, unless the window read the fine one: a reading a few milliseconds late can
    // only serve a receipt that much past its expiry; a claim judges expiry afresh.
    let now = now.unwrap_or_else(|| rt.recent_ms());
    // Decoded under the shard's lock: the stored bytes are not shared out (no reference count to
    // move on a hot key).
    let value: T = memory.read_success(key, now, |stored, outcome, kept| {
        if matches!((fingerprint, stored), (Some(ours), Some(theirs)) if ours != theirs) {
            return None;
        }
        let Some(keeper) = keeper else {
            return serde_json::from_slice(outcome).ok();
        };
        // Kept by this function's type (another type under the key reads the JSON).
        if let Some(value) = kept.as_deref().and_then(keeper.take) {
            return Some(value);
        }
        let value: T = serde_json::from_slice(outcome).ok()?;
        if kept.is_none() {
            *kept = Some((keeper.keep)(&value));
        }
        Some(value)
    })?;
    rt.count(Counter::Replays);
    spec.metrics
        .count(Counter::Replays, spec.scope, spec.budget_name());
    spec.metrics
        .call(spec.scope, spec.budget_name(), true, took, 0);
    Some(Ok(value))
}

impl<T, E> Call<T, E> {
    pub(super) fn keep_inputs<I: Serialize>(&mut self, inputs: &I) {
        // A NaN would be kept as `null` and a re-run would send other inputs under this callId.
        match crate::codec::stored_json(inputs) {
            Ok(bytes) => self.ids.inputs = Some(Arc::from(bytes)),
            Err(e) => {
                call_event!(WARN, self, 0u32;
                    error = %e, "the call's inputs cannot be encoded; its compensation entry goes without them");
            }
        }
    }

    /// The lease a claim takes for one attempt: twice the timeout (at least one second more), or the
    /// runtime's lease without a timeout.
    pub(super) fn lease(&self) -> Duration {
        match self.spec.timeout {
            Some(t) => t.saturating_add(t.max(Duration::from_secs(1))),
            None => self.rt.lease(),
        }
    }

    pub(super) async fn start(&mut self) -> Step<T, E> {
        if !self.spec.scope_given {
            let spec = self.spec;
            let addr = std::ptr::from_ref(spec) as usize;
            let checked =
                scope::check(&spec.operation, addr, spec.scope, spec.name, self.self_type);
            if let Err(error) = checked {
                call_event!(ERROR, self, 0u32; error = %error, "refused before claiming");
                return self.fail_with(error);
            }
        }
        match self.problem.take().map(|p| *p) {
            None => {}
            Some(KeyProblem::Missing(part)) if self.spec.on_missing_key == OnMissingKey::Run => {
                call_event!(WARN, self, 0u32; part, function = self.spec.name,
                    "key part missing; running once without idempotency (on_missing_key = \"run\")");
                self.plain = true;
                // Its own admission, as below: one shared with the claiming path (returning after it
                // when plain) made every first call ~100 ns slower, measured side by side.
                if !self.took_place_now() {
                    if let Err(step) = Box::pin(self.wait_for_place()).await {
                        return step;
                    }
                }
                return Step::Attempt;
            }
            Some(KeyProblem::Missing(part)) => {
                call_event!(WARN, self, 0u32;
                    part, function = self.spec.name, "key part missing; nothing ran");
                return self.fail_with(Error::MissingKey {
                    part: part.to_owned(),
                });
            }
            Some(KeyProblem::Refused(part, reason)) => {
                call_event!(WARN, self, 0u32;
                    part, reason, function = self.spec.name, "key part refused; nothing ran");
                return self.fail_with(Error::InvalidKey {
                    part: part.to_owned(),
                    reason: reason.to_owned(),
                });
            }
        }
        let mut now = self.times.began_ms;
        if !self.took_place_now() {
            if let Err(step) = Box::pin(self.wait_for_place()).await {
                return step;
            }
            // The claim is stamped with the time it is made: a lease counted from before the wait
            // would end early (or have ended), and another caller could take the key over while
            // this call's attempt runs.
            now = self.rt.now_ms();
        }
        loop {
            let claim = Claim {
                key: self.ids.key.clone(),
                call_id: self.ids.call_id.clone(),
                fingerprint: self.ids.fingerprint,
                lease_ms: ms(self.lease()),
                now_ms: now,
            };
            self.times.claimed_ms = now;
            // The in-process store answers at once: no future to make and move.
            let (claimed, sent) = match self.rt.memory() {
                Some(memory) => (memory.claim_now(claim), None),
                None => {
                    let sent = tokio::time::Instant::now();
                    self.phase = Phase::Claiming(sent);
                    let claimed = self.rt.store().claim(claim).await;
                    // Answered: the claim is no longer on its way (the answer says whether it holds).
                    self.phase = Phase::Free;
                    (claimed, Some(sent))
                }
            };
            match claimed {
                Err(e) => {
                    if let Some(sent) = sent.filter(|_| unanswered::may_have_been_written(&e)) {
                        self.unanswered(sent, format!("the store failed while answering it: {e}"));
                    }
                    return self.store_failed(e);
                }
                Ok(Claimed::Acquired(fence)) => {
                    self.phase = match sent {
                        None => Phase::JustClaimed(fence),
                        Some(_) => Phase::Owner(fence),
                    };
                    self.count(Counter::Claims);
                    call_event!(DEBUG, self, 0u32;
                        fence = fence.0, function = self.spec.name, "claimed");
                    return Step::Attempt;
                }
                Ok(Claimed::Existing(record)) => match sent {
                    Some(sent) if self.sent_by_this_call(&record) => {
                        return Box::pin(self.own_claim_answered_again(record, sent)).await;
                    }
                    _ => match Box::pin(self.held(record)).await {
                        Held::Step(step) => return step,
                        Held::Reclaim => now = self.rt.now_ms(),
                    },
                },
            }
        }
    }

    /// Takes the call's place in its dependency's concurrency limit if one is free now: no future to
    /// make (the common case). Else the call waits for one ([`wait_for_place`](Call::wait_for_place),
    /// boxed where it is awaited, as every slow path).
    pub(super) fn took_place_now(&mut self) -> bool {
        self.place.admitted = self.place.dependency.limiter.enter_now();
        self.place.admitted
    }

    /// Waits for the call's place in its dependency's concurrency limit, which had none free;
    /// refused ([`Error::Overloaded`]) after `max_wait`, before anything is claimed.
    pub(super) async fn wait_for_place(&mut self) -> Result<(), Step<T, E>> {
        if self.place.enclosing.holds(self.limiter_addr()) {
            // Nested in a call that holds a place in this limit, given back only once this call has
            // answered: waiting for a place would be waiting for itself.
            call_event!(DEBUG, self, 0u32; dependency = %self.place.dependency.name,
                "concurrency limit full; running on the enclosing call's place");
            return Ok(());
        }
        match self.place.dependency.limiter.wait_for_place().await {
            Ok(()) => {
                self.place.admitted = true;
                Ok(())
            }
            Err(refused) => {
                self.count(Counter::Overloaded);
                call_event!(WARN, self, 0u32;
                    dependency = %self.place.dependency.name, limit = refused.limit,
                    "dependency rate limited and its concurrency limit full; nothing ran");
                Err(self.fail_with(Error::Overloaded {
                    dependency: self.place.dependency.name.clone(),
                    limit: refused.limit,
                }))
            }
        }
    }

    /// The address that names this call's limiter in a [`Places`](crate::context::Places).
    pub(super) fn limiter_addr(&self) -> usize {
        std::ptr::from_ref(&self.place.dependency.limiter) as usize
    }

    /// Whether an existing `record` is the claim this call sent (stamped `claimed_ms`), as written: a
    /// store client that re-sent it after a reset (the Redis Cluster client does) gets it back as
    /// existing.
    pub(super) fn sent_by_this_call(&self, record: &Receipt) -> bool {
        !self.ids.adopted
            && unanswered::written_as_sent(
                record,
                &self.ids.call_id,
                self.times.claimed_ms,
                self.rt.store().clock() == StoreClock::Caller,
            )
    }

    /// Owns the key under the fence of this call's own claim, answered again as existing: nobody else
    /// writes under a callId this call made, and nobody took it over. Its lease ran while the claim was
    /// sent again, so it is renewed before the attempt; a refusal means another owner holds the key now,
    /// and a failing store hands the claim to a task that gives it back.
    pub(super) async fn own_claim_answered_again(
        &mut self,
        record: Receipt,
        sent: tokio::time::Instant,
    ) -> Step<T, E> {
        call_event!(INFO, self, 0u32;
            fence = record.fence.0, "the store answered this call's own claim as existing (sent again); it is this call's");
        self.phase = Phase::Owner(record.fence);
        self.count(Counter::Claims);
        match self.extend_lease(Duration::ZERO).await {
            Ok(()) => Step::Attempt,
            Err(e) if e.lost_key() => self.fenced_out(None).await,
            Err(e) => {
                self.phase = Phase::Free;
                self.unanswered(
                    sent,
                    format!("the store failed while renewing its lease: {e}"),
                );
                self.store_failed(e)
            }
        }
    }

    /// Hands a claim sent at `sent` whose answer never came to a task that gives it back if it was
    /// written ([`crate::unanswered`]). Not under an adopted callId: a record carrying it may be
    /// another call's, running; such a claim is left to its lease.
    pub(super) fn unanswered(&self, sent: tokio::time::Instant, why: String) {
        if self.ids.adopted {
            call_event!(WARN, self, 0u32; why = %why,
                "claim unanswered under an adopted callId, which other calls may carry; it is left to its lease");
            return;
        }
        Unanswered {
            key: self.ids.key.clone(),
            call_id: self.ids.call_id.clone(),
            sent,
            stamped_ms: self.times.claimed_ms,
            lease: self.lease(),
            keep_ms: ms(self.spec.ttl),
            why,
        }
        .give_back(&self.rt);
    }
}
