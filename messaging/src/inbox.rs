//! The consumer's inbox: a message's work done once per message identity, whatever the broker
//! redelivers (`docs/rules.md`, *Field lessons*: the consumer deduplicates too), and what to tell the broker afterwards.

use std::fmt::Display;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use samekey_runtime::at_most_once::{AtMostOnce, OnBusy, OnUnknown};
use samekey_runtime::journal::{Event, EventKind};
use samekey_runtime::key::{Fingerprint, Key, KeyBuilder, KeyEncoder};
use samekey_runtime::store::StoreError;
use samekey_runtime::{CallId, Classify, Error, ErrorClass, KeyPart, ReceiptState, Runtime};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::delivery::{Delivery, Disposition, Handled, Identity, Read};
use crate::envelope::Envelope;

/// The largest [`Inbox::max_deliveries`]: well inside the journal's bound, so that its requeues are
/// all still there to count.
pub const MAX_DELIVERIES: u64 = 100;

/// What one run of a message's work came to.
struct Worked<R, E> {
    result: Result<R, E>,
    /// samekey refused the work before its handler was reached, for a reason that passes.
    refused_for_now: bool,
}

/// The error of a message's work as the call sees it: the handler's own, or samekey's — kept apart so
/// that the inbox can tell a refusal of samekey's from anything the handler answered.
enum Work<E> {
    Handler(E),
    Samekey(Error),
}

impl<E: From<Error>> Work<E> {
    fn into_error(self) -> E {
        match self {
            Work::Handler(e) => e,
            Work::Samekey(e) => E::from(e),
        }
    }

    /// samekey refused the work for a reason that passes: the runtime's concurrency limit was full,
    /// or its store could not be reached or was full. Only meaningful when the handler was not
    /// reached (a store failure after the handler ran is no refusal).
    fn refused_for_now(&self) -> bool {
        matches!(
            self,
            Work::Samekey(
                Error::Overloaded { .. }
                    | Error::Store(StoreError::Unavailable(_) | StoreError::Full { .. })
            )
        )
    }
}

impl<E> From<Error> for Work<E> {
    fn from(error: Error) -> Work<E> {
        Work::Samekey(error)
    }
}

impl<E: Classify> Classify for Work<E> {
    fn classify(&self) -> ErrorClass {
        match self {
            Work::Handler(e) => e.classify(),
            Work::Samekey(e) => e.classify(),
        }
    }
}

impl<E: Display> Display for Work<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Work::Handler(e) => e.fmt(f),
            Work::Samekey(e) => e.fmt(f),
        }
    }
}

/// The pause before a busy delivery goes back to the broker.
const BUSY_DELAY: Duration = Duration::from_secs(1);

/// The pause before the redelivery of a message whose `deliveries`-th delivery was requeued: 100 ms,
/// doubling, at most 10 s.
fn requeue_delay(deliveries: u64) -> Duration {
    let doublings = u32::try_from(deliveries.saturating_sub(1))
        .unwrap_or(u32::MAX)
        .min(7);
    Duration::from_millis(100 << doublings).min(Duration::from_secs(10))
}

/// A payload's JSON value as a `verify` part: its kinds kept apart, an object's members in the order
/// of their names (so that a map whose order varies, a `HashMap`, fingerprints alike), a number by its
/// JSON text. `None` (no JSON encoding) refuses it: the delivery fails with `Error::InvalidKey`.
struct Payload(Option<serde_json::Value>);

impl Payload {
    /// `payload`'s JSON value, made once per delivery for its `verify` part and, after a failure,
    /// its fingerprint.
    fn of<T: Serialize>(payload: &T) -> Payload {
        Payload(serde_json::to_value(payload).ok())
    }
}

impl KeyPart for Payload {
    fn encode_key(&self, out: &mut KeyEncoder) {
        match &self.0 {
            Some(value) => json(value, out),
            None => out.refuse("the message's payload has no JSON encoding"),
        }
    }
}

fn json(value: &serde_json::Value, out: &mut KeyEncoder) {
    use serde_json::Value;
    match value {
        Value::Null => out.unit(),
        Value::Bool(b) => out.boolean(*b),
        Value::Number(n) => {
            out.variant("number", 1);
            out.str(&n.to_string());
        }
        Value::String(s) => out.str(s),
        Value::Array(items) => {
            out.seq(items.len());
            for item in items {
                json(item, out);
            }
        }
        Value::Object(members) => {
            let mut members: Vec<_> = members.iter().collect();
            members.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.map(members.len());
            for (name, value) in members {
                out.str(name);
                json(value, out);
            }
        }
    }
}

/// A consumer's inbox: runs a message's handler **at most once per message identity** (its callId
/// and [`seq`](Envelope::seq), or for a message without envelope the broker's message id) — a
/// message redelivered (by the broker, or republished by a producer that retried) gets its first
/// delivery's outcome without running again, and each message of a call that published several is
/// worked — claimed and recorded in the runtime's store like any `#[idempotent]` call, under the
/// callId of the message's work ([`Envelope::inbound`]).
///
/// | delivery | answer |
/// |---|---|
/// | a message's first | its handler runs, under the message's traceId |
/// | the same message again (same callId, `seq`, payload) | the first delivery's outcome; the handler does not run |
/// | another message of the same call (another `seq`) | its own handler run: a message of its own |
/// | the identity of a message already delivered with another payload | `samekey::Error::KeyReuse`; nothing runs |
/// | a payload with no JSON encoding | `samekey::Error::InvalidKey`; nothing runs |
///
/// The key is the inbox's scope, the callId and, from the second message of a call on, its `seq` (a
/// call's first message keeps the key it had before messages were numbered); the payload's JSON
/// value is the call's `verify` fingerprint (object members in name order). A message without
/// envelope is keyed by its broker message id, apart from every envelope's key.
///
/// # What to tell the broker
///
/// [`Inbox::handle`] takes a broker's [`Delivery`] and answers a [`Handled`] whose
/// [`Disposition`] the consumer carries out, judged by the store's record of the message — never by
/// the error's type alone:
///
/// | the record after the delivery | disposition |
/// |---|---|
/// | `SUCCESS` (worked now, or before) | ack |
/// | `FAILED` (the handler failed for good: a `Permanent` error) | dead-letter |
/// | another message's (its identity reused with another payload: `KeyReuse`) | dead-letter; nothing runs |
/// | `UNKNOWN` (the handler's outcome is uncertain) | ack: the compensation worker owns it now; with [`OnUnknown::Rerun`], requeue (counted) so that the next delivery takes it over |
/// | none, or given back (a `Retryable`, `RateLimited` or `Rejected` error; the store unreachable after the handler was reached) | requeue after a backoff, until [`max_deliveries`](Inbox::max_deliveries), then dead-letter |
/// | `PROCESSING` (another delivery is being worked, its claim alive) | busy: requeue after a pause, not counted |
/// | none, the handler never reached: samekey refused to begin ([`Error::Overloaded`]: the runtime's concurrency limit full; the store unreachable or full before the claim) | deferred: requeue after a pause (at least 1 s), not counted — `max_deliveries` counts the deliveries that reached the handler, so a message is never dead-lettered for the consumer's own overload |
/// | a body that is not the handler's type, a message with no identity | dead-letter |
///
/// So a message is acknowledged only once its outcome is recorded; a consumer that crashes before
/// leaves it unacknowledged, and the broker's redelivery is answered from the receipt. Every
/// delivery that is not a first one acked, nor a busy one, is journaled ([`EventKind::Delivered`]:
/// the broker's delivery count and `redelivered` flag, the disposition), under the message's key;
/// the deliveries counted toward `max_deliveries` are the journal's requeues (a broker's own count,
/// also journaled, counts busy deliveries too).
///
/// # A consumer that dies mid-work
///
/// Its claim stays `PROCESSING` until its lease (the runtime's) runs out; the broker's redelivery is
/// answered busy meanwhile, and the first delivery after takes the message over. With the default
/// [`OnUnknown::Hold`] the handler may have acted, so the message goes `UNKNOWN`, to compensation
/// (and is acked). A handler whose writes commit together with its receipt
/// (`PgStore::complete_in`, `SqliteStore::complete_in`: a crash leaves neither) can be run again
/// safely: give the inbox [`OnUnknown::Rerun`] and the take-over works the message.
///
/// # Horizons
///
/// A broker's own duplicate detection is short: JetStream's duplicate window is 2 minutes by
/// default, RabbitMQ keeps none. The inbox remembers a message for its [`ttl`](Inbox::ttl) (7 days
/// by default): a copy republished an hour later (a relay that crashed between publish and mark, a
/// producer retrying after an outage) is still dropped.
#[derive(Debug)]
pub struct Inbox {
    runtime: Option<Runtime>,
    scope: String,
    ttl: Duration,
    max_deliveries: u64,
    on_unknown: OnUnknown,
    spec: OnceLock<&'static AtMostOnce>,
}

impl Inbox {
    /// The inbox of one consumer (`scope` names it: `"shipping.on_paid"`), on the ambient runtime,
    /// remembering what it did for 7 days (longer than a broker keeps redelivering), giving a message
    /// up to the dead letters after 5 deliveries that did not settle it.
    pub fn new(scope: impl Into<String>) -> Inbox {
        Inbox {
            runtime: None,
            scope: scope.into(),
            ttl: Duration::from_secs(7 * 24 * 60 * 60),
            max_deliveries: 5,
            on_unknown: OnUnknown::Hold,
            spec: OnceLock::new(),
        }
    }

    /// On `runtime`'s store.
    pub fn runtime(mut self, runtime: &Runtime) -> Inbox {
        self.runtime = Some(runtime.clone());
        self
    }

    /// How long a delivered message is remembered (default 7 days).
    pub fn ttl(mut self, ttl: Duration) -> Inbox {
        self.ttl = ttl;
        self.spec = OnceLock::new();
        self
    }

    /// How many deliveries of a message may end without settling it (requeued) before
    /// [`Inbox::handle`] dead-letters it (default 5; 1 to [`MAX_DELIVERIES`], clamped: the
    /// requeues are counted in the message's journal, which keeps its latest
    /// [`JOURNAL_LIMIT`](samekey_runtime::journal::JOURNAL_LIMIT) events).
    pub fn max_deliveries(mut self, deliveries: u64) -> Inbox {
        self.max_deliveries = deliveries.clamp(1, MAX_DELIVERIES);
        self
    }

    /// What a delivery that finds the message's earlier work uncertain does (a consumer died
    /// mid-work and its lease ran out): [`OnUnknown::Hold`] (the default) leaves it `UNKNOWN` for
    /// compensation; [`OnUnknown::Rerun`] runs the handler again under the same callId — only for a
    /// handler whose writes commit with its receipt (see the type's documentation).
    pub fn on_unknown(mut self, on_unknown: OnUnknown) -> Inbox {
        self.on_unknown = on_unknown;
        self.spec = OnceLock::new();
        self
    }

    /// The inbox's scope.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    fn spec(&self) -> &'static AtMostOnce {
        self.spec.get_or_init(|| {
            AtMostOnce::inbound_work(
                "Inbox::deliver",
                "msg",
                self.ttl,
                OnBusy::Wait,
                self.on_unknown,
            )
        })
    }

    fn runtime_here(&self) -> Runtime {
        match &self.runtime {
            Some(runtime) => runtime.clone(),
            None => samekey_runtime::runtime::ambient(),
        }
    }

    /// The key of a message of this inbox (see the type's documentation).
    fn key(&self, identity: &Identity) -> KeyBuilder {
        let mut key = KeyBuilder::new(&self.scope);
        match identity {
            Identity::Envelope { call_id, seq } => {
                key.part(call_id.as_str());
                if *seq != 0 {
                    key.part(seq);
                }
            }
            // A tuple part of its own kind: never the key of an envelope.
            Identity::Foreign(id) => key.part(&("foreign", id.as_str())),
        }
        key
    }

    /// The key under which this inbox records `message` (its receipt, its journal): for the
    /// `samekey` command (`samekey history --key …`) and tests.
    pub fn key_of<T>(&self, message: &Envelope<T>) -> Key {
        self.key(&Identity::Envelope {
            call_id: message.call_id.clone(),
            seq: message.seq,
        })
        .finish()
    }

    /// The key under which this inbox records a message without envelope whose broker message id is
    /// `id`.
    pub fn key_of_foreign(&self, id: &str) -> Key {
        self.key(&Identity::Foreign(id.to_owned())).finish()
    }

    /// Runs `handler` on the message's payload, under the callId of its work and its traceId, unless a
    /// delivery of the same message (callId and `seq`) already did: then answers that delivery's
    /// outcome (a failure by its message, as `samekey::Error::Failed`, through
    /// `E: From<samekey::Error>`). A delivery of that identity with another payload is
    /// `samekey::Error::KeyReuse`, and nothing runs.
    pub async fn deliver<T, R, E, F, Fut>(&self, message: Envelope<T>, handler: F) -> Result<R, E>
    where
        T: Serialize,
        F: FnOnce(T) -> Fut,
        Fut: Future<Output = Result<R, E>>,
        R: Serialize + DeserializeOwned,
        E: Classify + From<Error> + Display,
    {
        let json = Payload::of(&message.payload);
        self.deliver_read(message, &json, handler).await.result
    }

    /// [`Inbox::deliver`], the payload's JSON value made already.
    async fn deliver_read<T, R, E, F, Fut>(
        &self,
        message: Envelope<T>,
        json: &Payload,
        handler: F,
    ) -> Worked<R, E>
    where
        F: FnOnce(T) -> Fut,
        Fut: Future<Output = Result<R, E>>,
        R: Serialize + DeserializeOwned,
        E: Classify + From<Error> + Display,
    {
        let inbound = message.inbound();
        let Envelope {
            call_id,
            seq,
            payload,
            ..
        } = message;
        let key = self.key(&Identity::Envelope { call_id, seq });
        inbound.scope(self.run(key, json, payload, handler)).await
    }

    /// Runs `handler` on the payload of a message that came without envelope (from a producer that
    /// does not use samekey), at most once per broker message `id` — AMQP `message_id`, NATS
    /// `Nats-Msg-Id` — as [`Inbox::deliver`] does for an envelope. The handler's calls get a callId
    /// of their own (the message brings none) and a new traceId.
    pub async fn deliver_foreign<T, R, E, F, Fut>(
        &self,
        id: &str,
        payload: T,
        handler: F,
    ) -> Result<R, E>
    where
        T: Serialize,
        F: FnOnce(T) -> Fut,
        Fut: Future<Output = Result<R, E>>,
        R: Serialize + DeserializeOwned,
        E: Classify + From<Error> + Display,
    {
        let key = self.key(&Identity::Foreign(id.to_owned()));
        self.run(key, &Payload::of(&payload), payload, handler)
            .await
            .result
    }

    /// The `verify` parts of a message: its payload's JSON value.
    fn verify(&self, json: &Payload) -> KeyBuilder {
        let mut verify = KeyBuilder::new(&self.scope);
        verify.verify_part(json, "payload");
        verify
    }

    /// Runs the work at most once under `key` (`verify` on the payload's JSON value), and says
    /// whether samekey refused it before the handler was reached, for a reason that passes (see
    /// [`Work::refused_for_now`]).
    async fn run<T, R, E, F, Fut>(
        &self,
        key: KeyBuilder,
        json: &Payload,
        payload: T,
        handler: F,
    ) -> Worked<R, E>
    where
        F: FnOnce(T) -> Fut,
        Fut: Future<Output = Result<R, E>>,
        R: Serialize + DeserializeOwned,
        E: Classify + From<Error> + Display,
    {
        let reached = AtomicBool::new(false);
        let result = self
            .spec()
            .with_key(key)
            .verify_with(self.verify(json))
            .runtime_or_ambient(self.runtime.as_ref())
            .run_once(|| {
                reached.store(true, Ordering::Relaxed);
                let work = handler(payload);
                async move { work.await.map_err(Work::Handler) }
            })
            .await;
        let refused_for_now = match &result {
            Err(error) => !reached.load(Ordering::Relaxed) && error.refused_for_now(),
            Ok(_) => false,
        };
        Worked {
            result: result.map_err(Work::into_error),
            refused_for_now,
        }
    }

    /// Works a broker's delivery once and says what to tell the broker (see the type's
    /// documentation): the body is read as an [`Envelope<T>`], else as a `T` whose ids are in the
    /// headers ([`Envelope::from_attributes`]: a body a broker or a bridge re-serialized), else as a
    /// `T` identified by the broker's message id ([`Inbox::deliver_foreign`]). A body that is none of
    /// these, or a message with no identity at all, is dead-lettered without running anything.
    pub async fn handle<T, R, E, F, Fut>(
        &self,
        delivery: &Delivery<'_>,
        handler: F,
    ) -> Handled<R, E>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(T) -> Fut,
        Fut: Future<Output = Result<R, E>>,
        R: Serialize + DeserializeOwned,
        E: Classify + From<Error> + Display,
    {
        let (identity, work_call_id, json, result) = match delivery.read::<T>() {
            Err(reason) => {
                tracing::warn!(target: "samekey", scope = %self.scope, id = ?delivery.message_id,
                    %reason, "samekey: an unreadable message goes to the dead letters");
                return Handled::Unreadable { reason };
            }
            Ok(Read::Envelope(envelope)) => {
                let identity = Identity::Envelope {
                    call_id: envelope.call_id.clone(),
                    seq: envelope.seq,
                };
                let work_call_id = envelope.work_call_id();
                let json = Payload::of(&envelope.payload);
                let result = self.deliver_read(envelope, &json, handler).await;
                (identity, work_call_id, json, result)
            }
            Ok(Read::Foreign { id, payload }) => {
                let json = Payload::of(&payload);
                let key = self.key(&Identity::Foreign(id.clone()));
                let result = self.run(key, &json, payload, handler).await;
                (Identity::Foreign(id), None, json, result)
            }
        };
        let key = self.key(&identity).finish();
        let first = !delivery.redelivered && delivery.delivery.unwrap_or(1) <= 1;
        let Worked {
            result,
            refused_for_now,
        } = result;
        match result {
            Ok(reply) => {
                if !first {
                    self.journal(&key, work_call_id, delivery, &Disposition::Ack)
                        .await;
                }
                Handled::Done(reply)
            }
            Err(error) => {
                // The fingerprint only a failure needs, from the JSON value made once.
                let fingerprint = self.verify(&json).fingerprint();
                let disposition = self
                    .after_failure(&key, fingerprint, &error, refused_for_now, delivery)
                    .await;
                if let Disposition::Busy { .. } | Disposition::Deferred { .. } = disposition {
                    // Not journaled: a dead consumer's lease, or a long overload, can make many,
                    // and the journal is bounded; the requeues it counts must stay in it.
                    tracing::debug!(target: "samekey", %key, redelivered = delivery.redelivered,
                        delivery = ?delivery.delivery,
                        "samekey: a delivery of a message being worked is given back");
                } else {
                    self.journal(&key, work_call_id, delivery, &disposition)
                        .await;
                }
                Handled::Failed { error, disposition }
            }
        }
    }

    /// What to tell the broker about a delivery that ended in `error`, from the store's record (of
    /// this message, or — `fingerprint` differs — of another message under its identity).
    /// `refused_for_now`: samekey refused the work before its handler was reached, for a reason
    /// that passes; such a delivery is deferred, not counted.
    async fn after_failure<E: Display>(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        error: &E,
        refused_for_now: bool,
        delivery: &Delivery<'_>,
    ) -> Disposition {
        let deferred = || Disposition::Deferred {
            reason: format!("{error}; the handler was not reached: not counted"),
            delay: requeue_delay(delivery.delivery.unwrap_or(1)).max(BUSY_DELAY),
        };
        let runtime = self.runtime_here();
        let record = match runtime.store().get(key, runtime.now_ms()).await {
            Ok(record) => record,
            Err(_) if refused_for_now => return deferred(),
            // Nothing is known: the broker keeps the message, and asks again later.
            Err(e) => {
                return Disposition::Requeue {
                    reason: format!("{error}; the store cannot say what became of it: {e}"),
                    delay: requeue_delay(1),
                }
            }
        };
        if let Some(theirs) = record.as_ref().and_then(|r| r.fingerprint) {
            if theirs != fingerprint {
                return Disposition::DeadLetter {
                    reason: format!(
                        "{error}; another message was worked under this identity (its id reused \
                         with another payload): this one is not worked"
                    ),
                };
            }
        }
        match record.map(|r| r.state) {
            Some(ReceiptState::Success) => Disposition::Ack,
            // Compensation owns it; with `Rerun`, the broker's next delivery takes it over.
            Some(ReceiptState::Unknown) if self.on_unknown != OnUnknown::Rerun => Disposition::Ack,
            Some(ReceiptState::Failed) => Disposition::DeadLetter {
                reason: format!("failed for good: {error}"),
            },
            Some(ReceiptState::Processing) => Disposition::Busy { delay: BUSY_DELAY },
            Some(ReceiptState::Unknown | ReceiptState::Received) | None if refused_for_now => {
                deferred()
            }
            Some(ReceiptState::Unknown | ReceiptState::Received) | None => {
                let deliveries = self.requeues(key).await + 1;
                if deliveries >= self.max_deliveries {
                    Disposition::DeadLetter {
                        reason: format!(
                            "{error}; given up after {deliveries} deliveries (max_deliveries {})",
                            self.max_deliveries
                        ),
                    }
                } else {
                    Disposition::Requeue {
                        reason: error.to_string(),
                        delay: requeue_delay(deliveries),
                    }
                }
            }
        }
    }

    /// How many deliveries of the message under `key` the journal says were requeued since it was
    /// last dead-lettered (a message moved back from the dead letters starts again; busy deliveries
    /// are not counted; a store that cannot say counts none).
    async fn requeues(&self, key: &Key) -> u64 {
        let runtime = self.runtime_here();
        let Ok(events) = runtime.store().journal(key, runtime.now_ms()).await else {
            return 0;
        };
        events.iter().fold(0, |count, event| match &event.what {
            EventKind::Delivered { disposition, .. } if disposition == "requeue" => count + 1,
            EventKind::Delivered { disposition, .. } if disposition == "dead-letter" => 0,
            _ => count,
        })
    }

    /// Journals a delivery under the message's key; a journal that cannot be written is logged (the
    /// disposition stands: the receipt, not the journal, decides).
    async fn journal(
        &self,
        key: &Key,
        work_call_id: Option<CallId>,
        delivery: &Delivery<'_>,
        disposition: &Disposition,
    ) {
        let runtime = self.runtime_here();
        let now = runtime.now_ms();
        // An envelope's work has its callId from the message (the record's, also after a
        // take-over, which keeps it): no read. A foreign message's is the record's, if it has one.
        let call_id = match work_call_id {
            Some(call_id) => call_id,
            None => match runtime.store().get(key, now).await {
                Ok(Some(record)) => record.call_id,
                _ => match CallId::new("msg", runtime.node()) {
                    Ok(call_id) => call_id,
                    Err(_) => return,
                },
            },
        };
        let event = Event {
            call_id,
            at_ms: now,
            node: runtime.node().to_owned(),
            what: EventKind::Delivered {
                delivery: delivery.delivery,
                redelivered: delivery.redelivered,
                disposition: disposition.name().to_owned(),
                detail: disposition.reason().unwrap_or_default().to_owned(),
            },
        };
        let keep_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        if let Err(e) = runtime
            .store()
            .append_journal(key, &[event], keep_ms, now)
            .await
        {
            tracing::warn!(target: "samekey", %key, error = %e,
                "samekey: a delivery could not be journaled");
        }
    }
}
