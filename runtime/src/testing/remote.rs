//! A fault-injecting remote side: wraps the effect your client has on the other system, delivers each
//! request through a [`Schedule`], records every delivery, and answers `status(call_id)` lookups from
//! what it recorded.

use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::fault::{Fault, Schedule};
use super::scope::CallScope;
use crate::call_id::CallId;
use crate::classify::{Classify, ErrorClass, RemoteStatus};

/// What a [`Remote`] answers when a fault hits a request: the error your client would see. Your
/// function's error type takes it in (`From<RemoteError>`), and classifies it through
/// [`RemoteError::classify`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RemoteError {
    /// The request or its reply was lost, or the caller gave up waiting: it may have taken effect.
    #[error("the request timed out: it may or may not have taken effect")]
    TimedOut,
    /// 503 before processing: nothing took effect.
    #[error("503: unavailable, nothing took effect")]
    Unavailable,
    /// 429: nothing took effect; try again after this long.
    #[error("429: rate limited, retry after {retry_after_ms} ms")]
    RateLimited {
        /// The `Retry-After`, in milliseconds.
        retry_after_ms: u64,
    },
    /// A permanent 4xx: refused for good.
    #[error("rejected for good")]
    Rejected,
    /// A refusal that changed nothing (a declined card): the same key may be tried again.
    #[error("declined, nothing took effect")]
    Declined,
}

impl Classify for RemoteError {
    /// `TimedOut`: unknown; `Unavailable`: retryable; `RateLimited`: rate-limited with its wait;
    /// `Rejected`: permanent; `Declined`: rejected (the claim is released).
    fn classify(&self) -> ErrorClass {
        match self {
            RemoteError::TimedOut => ErrorClass::Unknown,
            RemoteError::Unavailable => ErrorClass::Retryable,
            RemoteError::RateLimited { retry_after_ms } => ErrorClass::RateLimited {
                retry_after: Some(Duration::from_millis(*retry_after_ms)),
            },
            RemoteError::Rejected => ErrorClass::Permanent,
            RemoteError::Declined => ErrorClass::Rejected,
        }
    }
}

/// One request as the remote received it (or would have: a lost request is recorded too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The callId the request carried.
    pub call_id: String,
    /// The business key it was for (what [`Remote::call`] was given).
    pub key: String,
    /// The attempt of the call that sent it (1 for the first; 0 when sent by a compensation re-run or
    /// through [`Remote::call_as`]).
    pub attempt: u32,
    /// What the schedule did with it.
    pub fault: Fault,
    /// Whether it took effect on the remote side.
    pub took_effect: bool,
    /// The [`TestKit::call`](super::TestKit::call) it was sent under (its number, from 1), if any.
    pub caller: Option<u64>,
}

/// What the remote knows of a callId.
#[derive(Clone)]
enum Outcome<T> {
    InFlight,
    Done(T),
    Refused(RemoteError),
}

/// A request as sent, before the schedule has its say.
struct Sent {
    call_id: String,
    key: String,
    attempt: u32,
    caller: Option<u64>,
}

impl Sent {
    fn delivery(&self, fault: Fault, took_effect: bool) -> Delivery {
        Delivery {
            call_id: self.call_id.clone(),
            key: self.key.clone(),
            attempt: self.attempt,
            fault,
            took_effect,
            caller: self.caller,
        }
    }
}

/// How the remote answers a delivered request.
enum Reply<T> {
    Now(Result<T, RemoteError>),
    /// The caller crashes before the reply.
    Crash,
    /// No reply, ever.
    Never,
    /// A slow request: it takes effect after the delay, and the reply comes then.
    After(Duration, String, T),
}

struct State<T> {
    schedule: Schedule,
    /// Whether each next lookup fails (`true`), in order; then every lookup answers.
    failing_lookups: std::collections::VecDeque<bool>,
    deliveries: Vec<Delivery>,
    outcomes: HashMap<String, Outcome<T>>,
    lookups: u64,
}

/// A fake of the system your `#[idempotent]` function calls, with faults injected by a [`Schedule`].
///
/// Call [`Remote::call`] in the function's body with the business key and the effect — a closure
/// that makes the remote's answer (a charge, a shipment). The remote delivers the request through the
/// schedule's next fault, records it (callId, attempt, fault, whether it took effect), and answers as
/// the fault says: the value, or a [`RemoteError`] your function's error type takes in. It executes
/// every request that arrives (it deduplicates nothing, unless [`deduplicating`](Remote::deduplicating)),
/// so a second effect of one key is visible: [`effects_per_key`](Remote::effects_per_key).
/// [`status`](Remote::status) is a `lookup` answered from what it recorded.
///
/// Cloning gives another handle on the same remote.
pub struct Remote<T, E> {
    state: Arc<Mutex<State<T>>>,
    dedup: bool,
    _error: PhantomData<fn() -> E>,
}

impl<T, E> Clone for Remote<T, E> {
    fn clone(&self) -> Remote<T, E> {
        Remote {
            state: self.state.clone(),
            dedup: self.dedup,
            _error: PhantomData,
        }
    }
}

impl<T, E> Default for Remote<T, E>
where
    T: Clone + Send + 'static,
    E: From<RemoteError>,
{
    /// A remote on which every request succeeds ([`Schedule::healthy`]); [`script`](Remote::script)
    /// adds faults later.
    fn default() -> Remote<T, E> {
        Remote::new(Schedule::healthy())
    }
}

impl<T, E> Remote<T, E>
where
    T: Clone + Send + 'static,
    E: From<RemoteError>,
{
    /// A remote that delivers requests through `schedule` (`[Fault::LoseReply, Fault::Ok]`, a
    /// [`Schedule`]).
    pub fn new(schedule: impl Into<Schedule>) -> Remote<T, E> {
        Remote {
            state: Arc::new(Mutex::new(State {
                schedule: schedule.into(),
                failing_lookups: std::collections::VecDeque::new(),
                deliveries: Vec::new(),
                outcomes: HashMap::new(),
                lookups: 0,
            })),
            dedup: false,
            _error: PhantomData,
        }
    }

    /// A remote that honours the callId as an idempotency key (as an API with `Idempotency-Key`
    /// does): a request whose callId already took effect answers that outcome without a second
    /// effect. What `on_unknown = "rerun"` relies on.
    pub fn deduplicating(mut self) -> Remote<T, E> {
        self.dedup = true;
        self
    }

    /// The next lookups fail (`true`) or answer (`false`), in order; after them, every lookup
    /// answers. A failed lookup is the lookup's own error ([`RemoteError::Unavailable`]): the call
    /// stays undecided and asks again while it may.
    pub fn failing_lookups(self, pattern: impl IntoIterator<Item = bool>) -> Remote<T, E> {
        self.script_lookups(pattern);
        self
    }

    /// [`failing_lookups`](Remote::failing_lookups) on a remote already in use: the next lookups
    /// fail (`true`) or answer (`false`), after any pattern still ahead.
    pub fn script_lookups(&self, pattern: impl IntoIterator<Item = bool>) {
        self.state().failing_lookups.extend(pattern);
    }

    /// The next requests meet `faults`, in order, after those the schedule still has written for
    /// them (a seeded schedule draws after them): a remote that turns bad in the middle of a test.
    pub fn script(&self, faults: impl IntoIterator<Item = Fault>) {
        self.state().schedule.push(faults);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends the request for `key` under the running call's callId: `effect` makes the remote's answer
    /// if the request takes effect. Call it from the body of an `#[idempotent]` function.
    ///
    /// # Panics
    ///
    /// Outside the body of an `#[idempotent]` function (there is no callId to send).
    pub async fn call(&self, key: impl Into<String>, effect: impl FnOnce() -> T) -> Result<T, E> {
        let Some(cx) = crate::context::try_current() else {
            panic!(
                "samekey::testing::Remote::call outside an #[idempotent] function: call it from the \
                 function's body, where the call has its callId"
            );
        };
        let caller = CallScope::current();
        let sent = Sent {
            call_id: cx.call_id().to_string(),
            key: key.into(),
            attempt: cx.attempt(),
            caller: caller.as_ref().map(CallScope::number),
        };
        self.send(sent, caller, effect).await
    }

    /// Sends a request for `key` under `call_id`, from outside an `#[idempotent]` function: a client
    /// that does not use samekey (one that makes a new request id for every retry), or a request a
    /// test plants (the one a crashed process sent before it died). Recorded with attempt 0.
    pub async fn call_as(
        &self,
        call_id: impl std::fmt::Display,
        key: impl Into<String>,
        effect: impl FnOnce() -> T,
    ) -> Result<T, E> {
        let sent = Sent {
            call_id: call_id.to_string(),
            key: key.into(),
            attempt: 0,
            caller: None,
        };
        self.send(sent, None, effect).await
    }

    async fn send(
        &self,
        sent: Sent,
        caller: Option<CallScope>,
        effect: impl FnOnce() -> T,
    ) -> Result<T, E> {
        // Decided and recorded under the lock, answered after it: no lock is held across an await.
        match self.deliver(sent, effect) {
            Reply::Now(answer) => answer.map_err(E::from),
            Reply::Crash => {
                if let Some(caller) = caller {
                    caller.crash();
                }
                std::future::pending().await
            }
            Reply::Never => std::future::pending().await,
            Reply::After(delay, call_id, value) => {
                let state = self.state.clone();
                // The server finishes its work whatever the caller does meanwhile.
                let server = tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    state
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .outcomes
                        .insert(call_id, Outcome::Done(value.clone()));
                    value
                });
                server.await.map_err(|_| E::from(RemoteError::TimedOut))
            }
        }
    }

    /// Delivers one request through the schedule and records it. `effect` runs outside the remote's
    /// lock (it may use the remote).
    fn deliver(&self, sent: Sent, effect: impl FnOnce() -> T) -> Reply<T> {
        let fault = {
            let mut state = self.state();
            if self.dedup {
                let answer = match state.outcomes.get(&sent.call_id) {
                    Some(Outcome::Done(value)) => Some(Ok(value.clone())),
                    Some(Outcome::Refused(e)) => Some(Err(e.clone())),
                    Some(Outcome::InFlight) => Some(Err(RemoteError::TimedOut)),
                    None => None,
                };
                if let Some(answer) = answer {
                    state.deliveries.push(sent.delivery(Fault::Ok, false));
                    return Reply::Now(answer);
                }
            }
            state.schedule.next_fault()
        };
        let value = matches!(
            fault,
            Fault::Ok | Fault::LoseReply | Fault::Slow(_) | Fault::Crash
        )
        .then(effect);
        let mut state = self.state();
        // A slow request takes effect later, but it will whatever the caller does.
        state.deliveries.push(sent.delivery(fault, value.is_some()));
        let call_id = sent.call_id;
        let outcome = match (&value, fault) {
            (Some(_), Fault::Slow(_)) => Some(Outcome::InFlight),
            (Some(value), _) => Some(Outcome::Done(value.clone())),
            (None, Fault::Reject) => Some(Outcome::Refused(RemoteError::Rejected)),
            (None, _) => None,
        };
        if let Some(outcome) = outcome {
            state.outcomes.insert(call_id.clone(), outcome);
        }
        drop(state);
        match (fault, value) {
            (Fault::Ok, Some(value)) => Reply::Now(Ok(value)),
            (Fault::Crash, Some(_)) => Reply::Crash,
            (Fault::Slow(delay), Some(value)) => Reply::After(delay, call_id, value),
            (Fault::Unavailable, _) => Reply::Now(Err(RemoteError::Unavailable)),
            (Fault::RateLimited(wait), _) => Reply::Now(Err(RemoteError::RateLimited {
                retry_after_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
            })),
            (Fault::Reject, _) => Reply::Now(Err(RemoteError::Rejected)),
            (Fault::Decline, _) => Reply::Now(Err(RemoteError::Declined)),
            (Fault::Hang, _) => Reply::Never,
            // Lost on the way there or back.
            _ => Reply::Now(Err(RemoteError::TimedOut)),
        }
    }

    /// What the remote knows of `call_id`, as a `lookup` answers it: `Succeeded` with the value,
    /// `Failed` with a rejection, `Processing` while a slow request runs, `NotReceived` otherwise.
    ///
    /// ```ignore
    /// #[idempotent(key = "order_id", timeout = "1s", lookup = |call| self.gateway.status(call))]
    /// ```
    pub async fn status(&self, call_id: &CallId) -> Result<RemoteStatus<T, E>, RemoteError> {
        let mut state = self.state();
        state.lookups += 1;
        if state.failing_lookups.pop_front() == Some(true) {
            return Err(RemoteError::Unavailable);
        }
        Ok(match state.outcomes.get(call_id.as_str()) {
            Some(Outcome::Done(value)) => RemoteStatus::Succeeded(value.clone()),
            Some(Outcome::Refused(e)) => RemoteStatus::Failed(E::from(e.clone())),
            Some(Outcome::InFlight) => RemoteStatus::Processing,
            None => RemoteStatus::NotReceived,
        })
    }

    /// A compensation [`CompensationOperation`](crate::compensation::CompensationOperation) whose lookup is [`status`](Remote::status),
    /// to register on a [`Compensator`](crate::Compensator) (see
    /// [`TestKit::settle_with`](super::TestKit::settle_with)).
    pub fn operation(&self) -> crate::compensation::CompensationOperation
    where
        T: serde::Serialize,
        E: std::fmt::Display + 'static,
    {
        let remote = self.clone();
        crate::compensation::CompensationOperation::new(move |call: CallId| {
            let remote = remote.clone();
            async move { remote.status(&call).await }
        })
    }

    /// Every request received (and every lost one), in order.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.state().deliveries.clone()
    }

    /// How many times each key took effect on the remote side (keys that never took effect are
    /// absent). A key safe to retry took effect at most once, whatever the faults.
    pub fn effects_per_key(&self) -> BTreeMap<String, usize> {
        let mut effects = BTreeMap::new();
        for d in self.state().deliveries.iter().filter(|d| d.took_effect) {
            *effects.entry(d.key.clone()).or_default() += 1;
        }
        effects
    }

    /// How many times `key` took effect on the remote side.
    pub fn effects(&self, key: &str) -> usize {
        self.state()
            .deliveries
            .iter()
            .filter(|d| d.took_effect && d.key == key)
            .count()
    }

    /// The callId of every request received (and of every lost one), in order.
    pub fn call_ids(&self) -> Vec<String> {
        self.state()
            .deliveries
            .iter()
            .map(|d| d.call_id.clone())
            .collect()
    }

    /// Every callId that took effect and the value it answered, sorted by callId: the remote's
    /// settlement file (for [`reconcile`](crate::reconcile)). A slow request is here once its delay
    /// has passed.
    pub fn settled(&self) -> Vec<(String, T)> {
        let mut settled: Vec<(String, T)> = self
            .state()
            .outcomes
            .iter()
            .filter_map(|(call_id, outcome)| match outcome {
                Outcome::Done(value) => Some((call_id.clone(), value.clone())),
                _ => None,
            })
            .collect();
        settled.sort_by(|a, b| a.0.cmp(&b.0));
        settled
    }

    /// Whether a request under `call_id` took effect.
    pub fn took_effect(&self, call_id: &str) -> bool {
        self.state()
            .deliveries
            .iter()
            .any(|d| d.took_effect && d.call_id == call_id)
    }

    /// How many `status` lookups were asked.
    pub fn lookups(&self) -> u64 {
        self.state().lookups
    }

    /// The schedule as it was written (for failure messages: paste it to replay).
    pub fn schedule(&self) -> Schedule {
        self.state().schedule.clone()
    }
}
