//! The messaging part of the world: a producer that stages two events per order in an outbox, a relay
//! that publishes them with confirms, a broker that routes each to two queues, and consumers on every
//! node running an [`Inbox`] per queue — `shipping` and `email`, two scopes of one message — whose
//! handlers call a downstream service that deduplicates by callId.
//!
//! # The broker model
//!
//! A RabbitMQ-like broker: a publish is routed to both queues and confirmed; while the fault window
//! is open a confirm may be lost after the message was routed (the relay republishes it under the
//! same id: the broker keeps both copies, as RabbitMQ does), a publish may be returned unroutable or
//! refused before routing. A delivery stays unacked until settled; the deliveries of a consumer whose
//! node died go back to their queue, marked redelivered; an ack may be lost (the message comes again
//! later); a message may be delivered twice at once, or out of order. Between the broker and the
//! consumer, a component may re-serialise the body (the bare payload; the envelope without its
//! callId or its seq) or rewrite the headers (a tracing middleware's own `x-trace-id`; every header
//! gone but the broker's message id) — never all three places of the identity at once. A node may
//! come back with a newer consumer, whose payload type has one more optional field.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use samekey::{idempotent, Key};
use samekey_messaging::{
    Confirms, Delivery, Disposition, Envelope, Handled, Inbox, Message, OnUnknown, Publish,
    PublishError,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::coverage::{Fault, Surface};
use crate::payments::{PayError, Payments};
use crate::store::Life;
use crate::world::Shared;

/// Where the producer publishes.
pub const DESTINATION: &str = "orders.events";
/// The queues bound to it, each consumed under an inbox scope of the same name.
pub const QUEUES: [&str; 2] = ["shipping", "email"];
/// The scope whose inbox re-runs an uncertain message on its next delivery
/// (`OnUnknown::Rerun`); the other holds it for compensation (`OnUnknown::Hold`).
pub const RERUNS: &str = "shipping";
/// The kinds of event staged per order, in order (seq 0 and 1 of the staging call).
pub const KINDS: [&str; 2] = ["placed", "paid"];

/// An order event, as the producer and the first consumers know it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderEvent {
    /// The order.
    pub order: String,
    /// `placed` or `paid`.
    pub kind: String,
    /// Its amount.
    pub amount: u64,
}

/// The same event as a newer consumer knows it: one more optional field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderEventV2 {
    /// The order.
    pub order: String,
    /// `placed` or `paid`.
    pub kind: String,
    /// Its amount.
    pub amount: u64,
    /// A coupon, which older producers never send.
    #[serde(default)]
    pub coupon: Option<String>,
}

/// What a handler needs of either version of the payload.
pub trait Event: Serialize + DeserializeOwned + Send + 'static {
    /// The order and the kind.
    fn id(&self) -> (String, String);
}

impl Event for OrderEvent {
    fn id(&self) -> (String, String) {
        (self.order.clone(), self.kind.clone())
    }
}

impl Event for OrderEventV2 {
    fn id(&self) -> (String, String) {
        (self.order.clone(), self.kind.clone())
    }
}

/// One message's work done by a consumer: what the downstream service performed.
#[derive(Debug, Clone)]
pub struct Work {
    /// The consumer's scope.
    pub scope: String,
    /// The order.
    pub order: String,
    /// The event's kind.
    pub kind: String,
    /// The callId the work came under.
    pub call_id: String,
}

/// A message that reached a dead-letter queue.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The queue it was dead-lettered from.
    pub queue: String,
    /// The order and kind, read from the payload.
    pub event: Option<(String, String)>,
    /// Why.
    pub reason: String,
}

/// A row of the outbox: a message staged with the business write, published by the relay.
#[derive(Debug, Clone)]
pub struct Staged {
    /// The message.
    pub message: Message,
    /// The envelope it was made of (the consumers' keys are computed from it).
    pub envelope: Envelope<OrderEvent>,
    /// Whether the relay marked it sent.
    pub sent: bool,
}

#[derive(Debug, Clone)]
struct Queued {
    message: Message,
    deliveries: u64,
    ready_at: Instant,
}

#[derive(Default)]
struct BrokerState {
    queues: BTreeMap<&'static str, VecDeque<Queued>>,
    unacked: BTreeMap<u64, (&'static str, Queued, Arc<Life>)>,
    next_tag: u64,
    dead: Vec<DeadLetter>,
}

/// The broker, the outbox, the downstream service, and what they recorded.
pub struct Messaging {
    shared: Arc<Shared>,
    routed: tokio::sync::Notify,
    one_downstream: bool,
    scopes: Vec<&'static str>,
    broker: Mutex<BrokerState>,
    outbox: Mutex<Vec<Staged>>,
    downstream: Mutex<BTreeMap<String, u64>>,
    work: Mutex<Vec<Work>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Messaging {
    /// An empty broker, outbox and downstream service.
    pub fn new(shared: Arc<Shared>) -> Messaging {
        // A composition drawn per run: both scopes' handlers call one downstream service (a
        // notifications API that deduplicates by callId), or each its own.
        let one_downstream = shared.draws.chance(50)
            && shared
                .draws
                .keep(Some(Fault::OneDownstream), Surface::Inbox)
                .is_some();
        if one_downstream {
            shared.cover(Fault::OneDownstream, Surface::Inbox);
        }
        // Another composition: a second consumer scope (`email`) of the same messages, beside
        // `shipping`.
        let second = shared.draws.chance(70)
            && shared
                .draws
                .keep(Some(Fault::SecondScope), Surface::Inbox)
                .is_some();
        if second {
            shared.cover(Fault::SecondScope, Surface::Inbox);
        }
        let scopes = if second {
            QUEUES.to_vec()
        } else {
            QUEUES[..1].to_vec()
        };
        Messaging {
            shared,
            routed: tokio::sync::Notify::new(),
            one_downstream,
            scopes,
            broker: Mutex::new(BrokerState::default()),
            outbox: Mutex::new(Vec::new()),
            downstream: Mutex::new(BTreeMap::new()),
            work: Mutex::new(Vec::new()),
        }
    }

    /// The queues bound to the destination, each consumed under the inbox scope of its name.
    pub fn scopes(&self) -> Vec<&'static str> {
        self.scopes.clone()
    }

    /// Every row staged.
    pub fn staged(&self) -> Vec<Staged> {
        lock(&self.outbox).clone()
    }

    /// Every piece of work the downstream service performed.
    pub fn work(&self) -> Vec<Work> {
        lock(&self.work).clone()
    }

    /// Every dead letter.
    pub fn dead_letters(&self) -> Vec<DeadLetter> {
        lock(&self.broker).dead.clone()
    }

    /// Messages still queued or unacked.
    pub fn pending(&self) -> usize {
        let b = lock(&self.broker);
        b.queues.values().map(VecDeque::len).sum::<usize>() + b.unacked.len()
    }

    /// Stages a message in the outbox (the producer's business write).
    pub fn stage(&self, envelope: Envelope<OrderEvent>) -> Result<(), PayError> {
        let message = envelope
            .to_message(DESTINATION)
            .map_err(|e| PayError::Refused(e.to_string()))?;
        let mut outbox = lock(&self.outbox);
        if !outbox.iter().any(|s| s.message.id == message.id) {
            self.shared.history.log(
                "outbox",
                Some(&envelope.payload.order),
                format!("stages {} {}", envelope.payload.kind, message.id),
            );
            outbox.push(Staged {
                message,
                envelope,
                sent: false,
            });
        }
        Ok(())
    }

    /// One pass of the relay on the node `life`: publishes every unsent row, in order, with confirms,
    /// and marks what was confirmed.
    pub async fn relay_once(self: &Arc<Self>, life: &Arc<Life>) {
        let pending: Vec<Message> = lock(&self.outbox)
            .iter()
            .filter(|s| !s.sent)
            .map(|s| s.message.clone())
            .collect();
        let confirms = Confirms {
            timeout: Duration::from_secs(2),
            republishes: 2,
            backoff: Duration::from_millis(100),
        };
        let publisher = BrokerPublish {
            messaging: Arc::clone(self),
            life: Arc::clone(life),
        };
        for message in pending {
            let published = confirms
                .publish(&message, || publisher.publish(&message))
                .await;
            match published {
                Ok(()) => {
                    // The mark is a write to the database: a dead relay's never lands.
                    life.io().await;
                    for row in lock(&self.outbox)
                        .iter_mut()
                        .filter(|s| s.message.id == message.id)
                    {
                        row.sent = true;
                    }
                }
                Err(e) => {
                    self.shared.history.log(
                        life.name.clone(),
                        None,
                        format!("relay: {} not published: {e}", message.id),
                    );
                }
            }
        }
    }

    fn route(&self, message: &Message) {
        let draws = &self.shared.draws;
        let mut b = lock(&self.broker);
        for &queue in &self.scopes {
            // Held back a moment in one queue (a mirror catching up, a shovel): the messages
            // published after it overtake it there.
            let held = draws.fault(10)
                && draws
                    .keep(Some(Fault::Reordered), Surface::Broker)
                    .is_some();
            if held {
                self.shared.cover(Fault::Reordered, Surface::Broker);
            }
            let ready_at = Instant::now()
                + if held {
                    draws.ms(50, 3_000)
                } else {
                    Duration::ZERO
                };
            b.queues.entry(queue).or_default().push_back(Queued {
                message: message.clone(),
                deliveries: 0,
                ready_at,
            });
        }
        self.routed.notify_waiters();
    }

    /// Waits for the next delivery of `queue` to the consumer `life`: its tag, and the message with
    /// how many times it has been delivered.
    async fn next(&self, queue: &'static str, life: &Arc<Life>) -> (u64, Message, u64) {
        loop {
            life.answered().await;
            let routed = self.routed.notified();
            let wake = {
                let draws = &self.shared.draws;
                let mut b = lock(&self.broker);
                let now = Instant::now();
                let ready: Vec<usize> = b
                    .queues
                    .get(queue)
                    .map(|q| {
                        q.iter()
                            .enumerate()
                            .filter(|(_, m)| m.ready_at <= now)
                            .map(|(i, _)| i)
                            .collect()
                    })
                    .unwrap_or_default();
                if let Some(&first) = ready.first() {
                    let pick = if ready.len() > 1
                        && draws.fault(20)
                        && draws
                            .keep(Some(Fault::Reordered), Surface::Broker)
                            .is_some()
                    {
                        self.shared.cover(Fault::Reordered, Surface::Broker);
                        ready[1 + draws.below(ready.len() as u64 - 1) as usize]
                    } else {
                        first
                    };
                    let Some(q) = b.queues.get_mut(queue) else {
                        continue;
                    };
                    let Some(mut queued) = q.remove(pick) else {
                        continue;
                    };
                    queued.deliveries += 1;
                    if draws.fault(5)
                        && draws
                            .keep(Some(Fault::Duplicated), Surface::Broker)
                            .is_some()
                    {
                        self.shared.cover(Fault::Duplicated, Surface::Broker);
                        let mut twin = queued.clone();
                        twin.deliveries -= 1;
                        q.push_front(twin);
                    }
                    b.next_tag += 1;
                    let tag = b.next_tag;
                    b.unacked
                        .insert(tag, (queue, queued.clone(), Arc::clone(life)));
                    return (tag, queued.message, queued.deliveries);
                }
                // Nothing ready: wake when the next one is due, when something is routed, or in a
                // second (a delivery given back).
                let next_due = b
                    .queues
                    .get(queue)
                    .and_then(|q| q.iter().map(|m| m.ready_at).min());
                next_due.map_or(now + Duration::from_secs(1), |t| {
                    t.min(now + Duration::from_secs(1))
                })
            };
            tokio::select! {
                biased;
                () = routed => {}
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// The consumer's answer for a delivery.
    fn settle(&self, tag: u64, disposition: &Disposition, event: Option<(String, String)>) {
        let draws = &self.shared.draws;
        let mut b = lock(&self.broker);
        let Some((queue, mut queued, _)) = b.unacked.remove(&tag) else {
            return;
        };
        let lost = draws.fault(5)
            && draws
                .keep(Some(Fault::Redelivered), Surface::Broker)
                .is_some();
        if lost {
            // The ack (or nack) never reached the broker: the message comes again, redelivered.
            self.shared.cover(Fault::Redelivered, Surface::Broker);
            queued.ready_at = Instant::now() + draws.ms(2_000, 20_000);
            b.queues.entry(queue).or_default().push_back(queued);
            return;
        }
        match disposition {
            Disposition::Ack => {}
            Disposition::Requeue { delay, .. }
            | Disposition::Busy { delay }
            | Disposition::Deferred { delay, .. } => {
                queued.ready_at = Instant::now() + *delay;
                if !matches!(disposition, Disposition::Requeue { .. }) {
                    queued.deliveries -= 1;
                }
                b.queues.entry(queue).or_default().push_back(queued);
            }
            Disposition::DeadLetter { reason } => {
                b.dead.push(DeadLetter {
                    queue: queue.to_owned(),
                    event,
                    reason: reason.clone(),
                });
            }
        }
    }

    /// Gives one delivery back to its queue, redelivered (its consumer's channel closed).
    fn give_back(&self, tag: u64) {
        let mut b = lock(&self.broker);
        if let Some((queue, queued, _)) = b.unacked.remove(&tag) {
            b.queues.entry(queue).or_default().push_back(queued);
        }
    }

    /// Gives the unacked deliveries of dead consumers back to their queues (the broker saw their
    /// connections close).
    pub fn requeue_the_dead(&self) {
        let mut b = lock(&self.broker);
        let dead: Vec<u64> = b
            .unacked
            .iter()
            .filter(|(_, (_, _, life))| life.is_dead())
            .map(|(t, _)| *t)
            .collect();
        for tag in dead {
            if let Some((queue, queued, _)) = b.unacked.remove(&tag) {
                b.queues.entry(queue).or_default().push_back(queued);
            }
        }
    }

    /// The downstream service: performs the work of `event` for `scope` once per callId.
    async fn perform(
        &self,
        life: &Life,
        scope: &str,
        order: &str,
        kind: &str,
        call_id: &str,
    ) -> Result<u64, PayError> {
        let draws = &self.shared.draws;
        let sent = async {
            life.io().await;
            draws.shuffle().await;
            let fault = if draws.fault(15) {
                draws.keep(
                    Some(match draws.below(3) {
                        0 => Fault::Unavailable,
                        1 => Fault::ReplyLost,
                        _ => Fault::PanicHandler,
                    }),
                    Surface::Inbox,
                )
            } else {
                None
            };
            if let Some(fault) = fault {
                self.shared.cover(fault, Surface::Inbox);
            }
            tokio::time::sleep(draws.ms(5, 40)).await;
            if fault == Some(Fault::Unavailable) {
                return Err(PayError::Unavailable);
            }
            // One downstream service deduplicating by callId, or one per scope.
            let dedup_key = if self.one_downstream {
                call_id.to_owned()
            } else {
                format!("{scope} {call_id}")
            };
            let no = {
                let mut seen = lock(&self.downstream);
                let next = seen.len() as u64 + 1;
                *seen.entry(dedup_key).or_insert_with(|| {
                    lock(&self.work).push(Work {
                        scope: scope.to_owned(),
                        order: order.to_owned(),
                        kind: kind.to_owned(),
                        call_id: call_id.to_owned(),
                    });
                    self.shared.history.log(
                        format!("downstream/{scope}"),
                        Some(order),
                        format!("WORKS {kind} under {}", self.shared.history.id(call_id)),
                    );
                    next
                })
            };
            if fault == Some(Fault::ReplyLost) {
                return std::future::pending().await;
            }
            if fault == Some(Fault::PanicHandler) {
                panic!("sim: the handler panicked after its work");
            }
            life.answered().await;
            Ok(no)
        };
        tokio::time::timeout(Duration::from_secs(1), sent)
            .await
            .unwrap_or(Err(PayError::TimedOut))
    }
}

/// A node's publisher: the broker's confirms, returns and refusals.
struct BrokerPublish {
    messaging: Arc<Messaging>,
    life: Arc<Life>,
}

impl Publish for BrokerPublish {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let m = &self.messaging;
        let draws = &m.shared.draws;
        self.life.io().await;
        draws.shuffle().await;
        let fault = if draws.fault(15) {
            draws.keep(
                Some(match draws.below(3) {
                    0 => Fault::ConfirmLost,
                    1 => Fault::Returned,
                    _ => Fault::Unavailable,
                }),
                Surface::Publish,
            )
        } else {
            None
        };
        if let Some(fault) = fault {
            m.shared.cover(fault, Surface::Publish);
        }
        tokio::time::sleep(draws.ms(1, 20)).await;
        let id = message.id.clone();
        match fault {
            Some(Fault::Unavailable) => {
                return Err(PublishError::Unavailable("sim: no channel".into()))
            }
            Some(Fault::Returned) => {
                return Err(PublishError::Refused {
                    id,
                    reason: "sim: returned unroutable".into(),
                })
            }
            _ => {}
        }
        m.route(message);
        let order = serde_json::from_slice::<serde_json::Value>(&message.body)
            .ok()
            .and_then(|e| {
                e.pointer("/payload/order")
                    .and_then(|o| o.as_str().map(str::to_owned))
            });
        m.shared
            .history
            .log("broker", order.as_deref(), format!("routes {id}"));
        if fault == Some(Fault::ConfirmLost) {
            return std::future::pending().await;
        }
        self.life.answered().await;
        Ok(())
    }
}

/// What a component between the broker and the consumer did to a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rewrite {
    /// The body re-serialised as the bare payload (the ids stay in the headers).
    BarePayload,
    /// The envelope re-serialised without its `call_id`.
    NoCallId,
    /// The envelope re-serialised without its `seq`.
    NoSeq,
    /// A tracing middleware's own `x-trace-id`, the body the bare payload.
    TraceHeader,
    /// Every header dropped but the broker's message id, the body the bare payload.
    OnlyMessageId,
}

impl Rewrite {
    fn said(self) -> &'static str {
        match self {
            Rewrite::BarePayload => "the body re-serialised as the bare payload",
            Rewrite::NoCallId => "the body re-serialised without its call_id",
            Rewrite::NoSeq => "the body re-serialised without its seq",
            Rewrite::TraceHeader => {
                "the trace header rewritten by a middleware, the body the bare payload"
            }
            Rewrite::OnlyMessageId => {
                "every header dropped but the message id, the body the bare payload"
            }
        }
    }
}

/// A delivery as the consumer receives it.
struct Received {
    body: Vec<u8>,
    headers: Vec<(String, String)>,
    message_id: Option<String>,
    rewrite: Option<Rewrite>,
}

/// The delivery of `message` after the components in transit: as published, or rewritten by one
/// (never in all three places of its identity at once).
fn in_transit(shared: &Shared, message: &Message) -> Received {
    let draws = &shared.draws;
    let mut received = Received {
        body: message.body.clone(),
        headers: message.headers.clone(),
        message_id: Some(message.id.clone()),
        rewrite: None,
    };
    if !draws.fault(20) {
        return received;
    }
    let rewrite = match draws.below(5) {
        0 => Rewrite::BarePayload,
        1 => Rewrite::NoCallId,
        2 => Rewrite::NoSeq,
        3 => Rewrite::TraceHeader,
        _ => Rewrite::OnlyMessageId,
    };
    let fault = match rewrite {
        Rewrite::TraceHeader | Rewrite::OnlyMessageId => Fault::HeadersRewritten,
        Rewrite::BarePayload => Fault::BareBody,
        _ => Fault::BodyRewritten,
    };
    if draws.keep(Some(fault), Surface::Broker).is_none() {
        return received;
    }
    shared.cover(fault, Surface::Broker);
    let Ok(mut envelope) = serde_json::from_slice::<serde_json::Value>(&message.body) else {
        return received;
    };
    let bare = envelope
        .get("payload")
        .and_then(|p| serde_json::to_vec(p).ok());
    match rewrite {
        Rewrite::NoCallId | Rewrite::NoSeq => {
            if let Some(fields) = envelope.as_object_mut() {
                fields.remove(if rewrite == Rewrite::NoCallId {
                    "call_id"
                } else {
                    "seq"
                });
            }
            if let Ok(body) = serde_json::to_vec(&envelope) {
                received.body = body;
            }
        }
        _ => {
            if let Some(bare) = bare {
                received.body = bare;
            }
        }
    }
    match rewrite {
        Rewrite::TraceHeader => {
            for (name, value) in received.headers.iter_mut() {
                if name.eq_ignore_ascii_case("x-trace-id") {
                    *value = "0f8fad5b-d9cb-469f-a165-70867728950e".into();
                }
            }
        }
        Rewrite::OnlyMessageId => received.headers.clear(),
        _ => {}
    }
    received.rewrite = Some(rewrite);
    received
}

/// One consumer of `queue` on the node `life`: takes deliveries until the node dies.
pub async fn consume<T: Event>(
    messaging: Arc<Messaging>,
    payments: Arc<Payments>,
    queue: &'static str,
) {
    let life = Arc::clone(&payments.life);
    let inbox = Arc::new(
        Inbox::new(queue)
            .runtime(&payments.rt)
            .max_deliveries(8)
            .on_unknown(if queue == RERUNS {
                OnUnknown::Rerun
            } else {
                OnUnknown::Hold
            }),
    );
    loop {
        let (tag, message, deliveries) = messaging.next(queue, &life).await;
        messaging.shared.draws.shuffle().await;
        let Received {
            body,
            headers,
            message_id: id,
            rewrite,
        } = in_transit(&messaging.shared, &message);
        let event: Option<(String, String)> =
            serde_json::from_slice::<serde_json::Value>(&message.body)
                .ok()
                .and_then(|e| e.get("payload").cloned())
                .and_then(|p| serde_json::from_value::<OrderEvent>(p).ok())
                .map(|e| e.id());
        let subject = event.as_ref().map(|e| e.0.clone());
        // The handler runs in a task of its own: one that panics closes the consumer's channel, and
        // the broker gives the delivery back, as it does when a consumer's connection drops.
        let handling = {
            let (inbox, messaging, life) = (
                Arc::clone(&inbox),
                Arc::clone(&messaging),
                Arc::clone(&life),
            );
            let node = Arc::clone(&life);
            tokio::spawn(node.freezes(async move {
                let delivery = Delivery {
                    body: &body,
                    headers: &headers,
                    message_id: id.as_deref(),
                    delivery: Some(deliveries),
                    redelivered: deliveries > 1,
                };
                let handled: Handled<u64, PayError> = inbox
                    .handle(&delivery, |payload: T| async move {
                        let (order, kind) = payload.id();
                        let call_id = samekey::context::try_current()
                            .map(|c| c.call_id().to_string())
                            .unwrap_or_default();
                        messaging
                            .perform(&life, queue, &order, &kind, &call_id)
                            .await
                    })
                    .await;
                handled.disposition()
            }))
        };
        let Ok(disposition) = handling.await else {
            messaging.shared.history.log(
                format!("{}/{queue}", life.name),
                subject.as_deref(),
                format!(
                    "delivery {deliveries}{}: the handler panicked, the channel closes",
                    rewrite
                        .map(|w| format!(" ({})", w.said()))
                        .unwrap_or_default()
                ),
            );
            life.answered().await;
            messaging.give_back(tag);
            continue;
        };
        messaging.shared.history.log(
            format!("{}/{queue}", life.name),
            subject.as_deref(),
            format!(
                "delivery {deliveries} of {}{}: {}{}",
                event.as_ref().map(|e| e.1.as_str()).unwrap_or("?"),
                rewrite
                    .map(|w| format!(" ({})", w.said()))
                    .unwrap_or_default(),
                disposition.name(),
                disposition
                    .reason()
                    .map(|r| format!(" — {r}"))
                    .unwrap_or_default(),
            ),
        );
        life.answered().await;
        messaging.settle(tag, &disposition, event);
    }
}

impl Payments {
    /// The producer: stages the order's two events in the outbox, at most once per order.
    #[idempotent(key = "order + \"events\"", scope = "sim.events", runtime = &self.rt)]
    pub async fn stage_events(&self, order: &str, amount: u64) -> Result<u64, PayError> {
        let messaging = &self.world.messaging;
        for kind in KINDS {
            self.life.io().await;
            messaging.stage(Envelope::new(OrderEvent {
                order: order.to_owned(),
                kind: kind.to_owned(),
                amount,
            }))?;
        }
        Ok(KINDS.len() as u64)
    }
}

/// The keys the inbox of `scope` keeps `staged`'s message under, however it arrives: by its envelope,
/// and as a foreign message known only by its id.
pub fn keys_of(scope: &str, staged: &Staged) -> [Key; 2] {
    let inbox = Inbox::new(scope.to_owned());
    [
        inbox.key_of(&staged.envelope),
        inbox.key_of_foreign(&staged.message.id),
    ]
}
