//! NATS JetStream, on a real server (`SAMEKEY_NATS_URL`; a `skipped:` line without it): a
//! redelivery after a crash answered from the receipt; a `nak` worked once in the end, journaled
//! with JetStream's delivery counts; a poison message, a permanent failure and an unreadable body
//! dead-lettered; two messages of one `#[idempotent]` call both worked once; the duplicate window
//! drops a copy and the inbox one published after it; a publish whose ack is lost republished under
//! the same id; Python's nats-py as a foreign producer. Every test has streams of its own.
#![cfg(feature = "nats")]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use samekey::journal::EventKind;
use samekey::{idempotent, Classify, ErrorClass, Runtime, TraceId};
use samekey_messaging::nats::async_nats::jetstream::{self, Context};
use samekey_messaging::nats::{
    async_nats, create_stream, JetStreamConsumer, JetStreamPublisher, Settled,
};
use samekey_messaging::{
    Confirms, Disposition, Envelope, Handled, Inbox, Message, Publish, PublishError,
    HEADER_DEAD_LETTER_REASON,
};

#[derive(Debug, thiserror::Error)]
enum ShipError {
    #[error("the carrier is down")]
    Down,
    #[error("no such address")]
    NoAddress,
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for ShipError {
    fn classify(&self) -> ErrorClass {
        match self {
            ShipError::Down => ErrorClass::Retryable,
            ShipError::NoAddress => ErrorClass::Permanent,
            ShipError::Publish(e) => e.classify(),
            ShipError::Samekey(e) => e.classify(),
        }
    }
}

/// A test's own names: a stream `SK_<x>` over `sk.<x>.>`, a dead-letter stream `SKD_<x>` over
/// `skd.<x>.>`.
struct Names {
    stream: String,
    subject: String,
    dead_stream: String,
    dead_subject: String,
}

impl Names {
    fn new() -> Names {
        let x = format!("{:016x}", TraceId::new().as_u128() as u64);
        Names {
            stream: format!("SK_{x}"),
            subject: format!("sk.{x}.orders"),
            dead_stream: format!("SKD_{x}"),
            dead_subject: format!("skd.{x}.orders"),
        }
    }

    /// Creates the two streams, the first with `window` as its duplicate window.
    async fn create(&self, js: &Context, window: Duration) {
        let subjects = self.subject.replace(".orders", ".>");
        create_stream(js, &self.stream, &[&subjects], window)
            .await
            .expect("the stream is created");
        let dead = self.dead_subject.replace(".orders", ".>");
        create_stream(js, &self.dead_stream, &[&dead], Duration::from_secs(120))
            .await
            .expect("the dead-letter stream is created");
    }

    async fn delete(&self, js: &Context) {
        let _ = js.delete_stream(&self.stream).await;
        let _ = js.delete_stream(&self.dead_stream).await;
    }
}

/// The server's JetStream context, or `None` after a `skipped:` line.
async fn jetstream() -> Option<Context> {
    let Ok(url) = std::env::var("SAMEKEY_NATS_URL") else {
        samekey::conformance::skipped(
            "set SAMEKEY_NATS_URL (eval \"$(scripts/services start)\") for the NATS JetStream tests",
        );
        return None;
    };
    let client = async_nats::connect(url.as_str())
        .await
        .unwrap_or_else(|e| panic!("SAMEKEY_NATS_URL={url} is set but NATS answers: {e}"));
    Some(jetstream::new(client))
}

/// A consumer of the test's stream, its dead letters to the test's dead-letter subject.
async fn consumer(js: &Context, names: &Names, inbox: Inbox) -> JetStreamConsumer {
    JetStreamConsumer::builder(js.clone(), &names.stream, "shipping")
        .ack_wait(Duration::from_secs(1))
        .dead_letters(&names.dead_subject)
        .batch(1)
        .create(inbox)
        .await
        .expect("the consumer is created")
}

/// The next message, worked and settled, within 10 s.
async fn next<T, R, F, Fut>(consumer: &mut JetStreamConsumer, handler: F) -> Settled<R, ShipError>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
    F: FnOnce(T) -> Fut,
    Fut: std::future::Future<Output = Result<R, ShipError>>,
    R: serde::Serialize + serde::de::DeserializeOwned,
{
    tokio::time::timeout(Duration::from_secs(10), consumer.next(handler))
        .await
        .expect("a message within 10 s")
        .expect("the consumer pulls")
}

fn done<R: std::fmt::Debug, E: std::fmt::Debug>(settled: Settled<R, E>) -> R {
    assert!(settled.confirmed, "the server confirmed the ack");
    match settled.handled {
        Handled::Done(reply) => reply,
        other => panic!("not done: {other:?}"),
    }
}

/// What the consumer still holds: (pending, unacknowledged).
async fn outstanding(consumer: &JetStreamConsumer) -> (u64, usize) {
    let info = consumer
        .consumer()
        .get_info()
        .await
        .expect("the consumer's info");
    (info.num_pending, info.num_ack_pending)
}

async fn messages_in(js: &Context, stream: &str) -> u64 {
    js.get_stream(stream)
        .await
        .expect("the stream")
        .get_info()
        .await
        .expect("its info")
        .state
        .messages
}

/// The inbox's journal of deliveries of a key: (delivery count, redelivered, disposition).
async fn deliveries(rt: &Runtime, key: &samekey::Key) -> Vec<(Option<u64>, bool, String)> {
    rt.store()
        .journal(key, rt.now_ms())
        .await
        .expect("the journal")
        .into_iter()
        .filter_map(|event| match event.what {
            EventKind::Delivered {
                delivery,
                redelivered,
                disposition,
                ..
            } => Some((delivery, redelivered, disposition)),
            _ => None,
        })
        .collect()
}

/// The consumer worked a message and stopped before its ack (the work done and recorded): the
/// redelivery after the ack wait is answered from the receipt and acked; the handler ran once.
#[tokio::test]
async fn a_redelivery_after_a_crash_is_answered_from_the_receipt() {
    let Some(js) = jetstream().await else { return };
    let names = Names::new();
    names.create(&js, Duration::from_secs(120)).await;
    let rt = Runtime::builder().node("shipping-1").build().unwrap();
    let publisher = JetStreamPublisher::new(js.clone());
    let message = Envelope::new("o-1".to_owned());
    publisher
        .publish_envelope(&names.subject, &message)
        .await
        .unwrap();

    let inbox = Inbox::new("shipping.on_paid").runtime(&rt);
    let key = inbox.key_of(&message);
    let mut consumer = consumer(&js, &names, inbox).await;
    let run_counter = AtomicU32::new(0);
    let runs = &run_counter;
    let ship = |order: String| async move {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        Ok::<_, ShipError>(format!("shipped {order} (run {n})"))
    };

    // The crash: the work runs and its receipt is recorded, the ack never goes.
    let received = tokio::time::timeout(Duration::from_secs(10), consumer.receive())
        .await
        .expect("the message within 10 s")
        .unwrap();
    assert_eq!(received.delivered(), Some(1));
    assert_eq!(
        received.message_id(),
        Some(message.message_id().as_str()),
        "Nats-Msg-Id is the message's identity"
    );
    let handled = consumer.inbox().handle(&received.delivery(), ship).await;
    assert!(matches!(handled, Handled::Done(_)), "{handled:?}");
    drop(received);
    assert_eq!(outstanding(&consumer).await, (0, 1), "delivered, not acked");

    // JetStream redelivers after the ack wait: answered from the receipt, and acked.
    let settled = next(&mut consumer, ship).await;
    assert_eq!(settled.delivered, Some(2));
    assert_eq!(settled.disposition, Disposition::Ack);
    assert_eq!(done(settled), "shipped o-1 (run 1)");
    assert_eq!(run_counter.load(Ordering::SeqCst), 1, "shipped once");
    assert_eq!(outstanding(&consumer).await, (0, 0), "acked");
    assert_eq!(
        deliveries(&rt, &key).await,
        [(Some(2), true, "ack".to_owned())],
        "the redelivery is journaled"
    );
    names.delete(&js).await;
}

/// A handler that fails twice (retryable) gets the message `nak`ed and redelivered; the third
/// delivery works it; the journal holds each delivery with JetStream's count.
#[tokio::test]
async fn a_nak_is_worked_once_in_the_end() {
    let Some(js) = jetstream().await else { return };
    let names = Names::new();
    names.create(&js, Duration::from_secs(120)).await;
    let rt = Runtime::builder().node("shipping-1").build().unwrap();
    let message = Envelope::new("o-2".to_owned());
    JetStreamPublisher::new(js.clone())
        .publish_envelope(&names.subject, &message)
        .await
        .unwrap();
    let inbox = Inbox::new("shipping.on_paid").runtime(&rt);
    let key = inbox.key_of(&message);
    let mut consumer = consumer(&js, &names, inbox).await;
    let run_counter = AtomicU32::new(0);
    let runs = &run_counter;
    let ship = |order: String| async move {
        match runs.fetch_add(1, Ordering::SeqCst) {
            0 | 1 => Err(ShipError::Down),
            n => Ok(format!("shipped {order} (run {})", n + 1)),
        }
    };
    let mut seen = Vec::new();
    for _ in 0..3 {
        let settled = next(&mut consumer, ship).await;
        assert!(settled.confirmed);
        seen.push((settled.delivered, settled.disposition.name()));
    }
    assert_eq!(
        seen,
        [(Some(1), "requeue"), (Some(2), "requeue"), (Some(3), "ack")]
    );
    assert_eq!(run_counter.load(Ordering::SeqCst), 3);
    assert_eq!(outstanding(&consumer).await, (0, 0), "acked, nothing left");
    assert_eq!(
        deliveries(&rt, &key).await,
        [
            (Some(1), false, "requeue".to_owned()),
            (Some(2), true, "requeue".to_owned()),
            (Some(3), true, "ack".to_owned()),
        ]
    );
    names.delete(&js).await;
}

/// A message whose work keeps failing is dead-lettered on its `max_deliveries`-th delivery: the
/// dead-letter stream holds it, with its body, its `Nats-Msg-Id` and the reason; the original is
/// terminated, and JetStream has no limit of its own.
#[tokio::test]
async fn a_poison_message_is_dead_lettered_after_max_deliveries() {
    let Some(js) = jetstream().await else { return };
    let names = Names::new();
    names.create(&js, Duration::from_secs(120)).await;
    let rt = Runtime::builder().node("shipping-1").build().unwrap();
    let message = Envelope::new("o-3".to_owned());
    JetStreamPublisher::new(js.clone())
        .publish_envelope(&names.subject, &message)
        .await
        .unwrap();
    let inbox = Inbox::new("shipping.on_paid")
        .runtime(&rt)
        .max_deliveries(3);
    let key = inbox.key_of(&message);
    let mut consumer = consumer(&js, &names, inbox).await;
    assert_eq!(
        consumer.consumer().cached_info().config.max_deliver,
        -1,
        "the inbox, not JetStream, gives up"
    );
    let run_counter = AtomicU32::new(0);
    let runs = &run_counter;
    let ship = |_: String| async move {
        runs.fetch_add(1, Ordering::SeqCst);
        Err::<String, _>(ShipError::Down)
    };
    let mut seen = Vec::new();
    for _ in 0..3 {
        let settled = next(&mut consumer, ship).await;
        assert!(settled.confirmed, "{settled:?}");
        seen.push((settled.delivered, settled.disposition.name()));
    }
    assert_eq!(
        seen,
        [
            (Some(1), "requeue"),
            (Some(2), "requeue"),
            (Some(3), "dead-letter")
        ]
    );
    assert_eq!(run_counter.load(Ordering::SeqCst), 3);
    assert_eq!(outstanding(&consumer).await, (0, 0), "terminated");

    let dead = js
        .get_stream(&names.dead_stream)
        .await
        .unwrap()
        .get_last_raw_message_by_subject(&names.dead_subject)
        .await
        .expect("the dead letter");
    let reason = dead
        .headers
        .get(HEADER_DEAD_LETTER_REASON)
        .expect("the reason header")
        .to_string();
    assert!(
        reason.contains("given up after 3 deliveries"),
        "reason: {reason}"
    );
    assert_eq!(
        dead.headers.get("Nats-Msg-Id").map(|v| v.to_string()),
        Some(message.message_id())
    );
    assert_eq!(
        dead.headers.get("x-call-id").map(|v| v.to_string()),
        Some(message.call_id.to_string()),
        "its headers go with it"
    );
    let body: Envelope<String> = serde_json::from_slice(&dead.payload).unwrap();
    assert_eq!(body, message);
    let journal = deliveries(&rt, &key).await;
    assert_eq!(
        journal.last(),
        Some(&(Some(3), true, "dead-letter".to_owned()))
    );
    names.delete(&js).await;
}

/// A permanent failure is dead-lettered at its first delivery, and so is a body that is not the
/// handler's payload (its handler never runs).
#[tokio::test]
async fn a_permanent_failure_and_an_unreadable_body_are_dead_lettered_at_once() {
    let Some(js) = jetstream().await else { return };
    let names = Names::new();
    names.create(&js, Duration::from_secs(120)).await;
    let rt = Runtime::builder().node("shipping-1").build().unwrap();
    let publisher = JetStreamPublisher::new(js.clone());
    let message = Envelope::new("o-4".to_owned());
    publisher
        .publish_envelope(&names.subject, &message)
        .await
        .unwrap();
    let unreadable = Message {
        id: "raw-1".to_owned(),
        destination: names.subject.clone(),
        headers: vec![("x-origin".to_owned(), "a shell script".to_owned())],
        body: b"not json".to_vec(),
    };
    publisher.publish(&unreadable).await.unwrap();
    let inbox = Inbox::new("shipping.on_paid").runtime(&rt);
    let mut consumer = consumer(&js, &names, inbox).await;
    let run_counter = AtomicU32::new(0);
    let runs = &run_counter;
    let ship = |_: String| async move {
        runs.fetch_add(1, Ordering::SeqCst);
        Err::<String, _>(ShipError::NoAddress)
    };

    let permanent = next(&mut consumer, ship).await;
    assert_eq!(
        (permanent.delivered, permanent.disposition.name()),
        (Some(1), "dead-letter")
    );
    assert!(matches!(
        permanent.handled,
        Handled::Failed {
            error: ShipError::NoAddress,
            ..
        }
    ));
    let garbage = next(&mut consumer, ship).await;
    assert_eq!(
        (garbage.delivered, garbage.disposition.name()),
        (Some(1), "dead-letter")
    );
    assert!(matches!(garbage.handled, Handled::Unreadable { .. }));
    assert!(permanent.confirmed && garbage.confirmed);
    assert_eq!(
        run_counter.load(Ordering::SeqCst),
        1,
        "the garbage ran nothing"
    );
    assert_eq!(outstanding(&consumer).await, (0, 0));

    assert_eq!(messages_in(&js, &names.dead_stream).await, 2);
    let dead = js.get_stream(&names.dead_stream).await.unwrap();
    let first = dead.get_raw_message(1).await.unwrap();
    let reason = first.headers.get(HEADER_DEAD_LETTER_REASON).unwrap();
    assert!(reason.as_str().contains("failed for good"), "{reason}");
    let second = dead.get_raw_message(2).await.unwrap();
    assert_eq!(&second.payload[..], b"not json");
    assert_eq!(
        second.headers.get("Nats-Msg-Id").map(|v| v.to_string()),
        Some("raw-1".to_owned())
    );
    assert_eq!(
        second.headers.get("x-origin").map(|v| v.to_string()),
        Some("a shell script".to_owned())
    );
    names.delete(&js).await;
}

/// A call that publishes one message per line item; its first attempt fails after both were
/// acked, so the call retries and publishes both again, under the same ids.
struct Invoices {
    rt: Runtime,
    publisher: JetStreamPublisher,
    subject: String,
    duplicates: Mutex<Vec<bool>>,
    attempts: AtomicU32,
}

impl Invoices {
    #[idempotent(key = "order", runtime = &self.rt, backoff = "1ms..2ms")]
    async fn publish_lines(&self, order: &str) -> Result<(), ShipError> {
        for item in ["book", "pen"] {
            let message = Envelope::new(format!("{order}:{item}"))
                .to_message(self.subject.as_str())
                .expect("a string has a JSON encoding");
            let ack = self.publisher.publish_acked(&message).await?;
            self.duplicates.lock().unwrap().push(ack.duplicate);
        }
        if self.attempts.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(ShipError::Down);
        }
        Ok(())
    }
}

/// Both messages of one `#[idempotent]` call are worked, each once; the retried attempt's copies
/// are dropped by the duplicate window (same ids).
#[tokio::test]
async fn two_messages_of_one_idempotent_call_are_both_worked_once() {
    let Some(js) = jetstream().await else { return };
    let names = Names::new();
    names.create(&js, Duration::from_secs(120)).await;
    let rt = Runtime::builder().node("billing-1").build().unwrap();
    let invoices = Invoices {
        rt: rt.clone(),
        publisher: JetStreamPublisher::new(js.clone()),
        subject: names.subject.clone(),
        duplicates: Mutex::new(Vec::new()),
        attempts: AtomicU32::new(0),
    };
    invoices.publish_lines("o-7").await.unwrap();
    assert_eq!(
        *invoices.duplicates.lock().unwrap(),
        [false, false, true, true],
        "the retried attempt published the same two ids"
    );
    assert_eq!(messages_in(&js, &names.stream).await, 2);

    let inbox = Inbox::new("billing.on_line").runtime(&rt);
    let mut consumer = consumer(&js, &names, inbox).await;
    let worked = &Mutex::new(Vec::new());
    let bill = |line: String| async move {
        worked.lock().unwrap().push(line.clone());
        Ok::<_, ShipError>(format!("billed {line}"))
    };
    let first = done(next(&mut consumer, bill).await);
    let second = done(next(&mut consumer, bill).await);
    assert_eq!([first, second], ["billed o-7:book", "billed o-7:pen"]);
    assert_eq!(*worked.lock().unwrap(), ["o-7:book", "o-7:pen"]);
    assert_eq!(outstanding(&consumer).await, (0, 0));
    names.delete(&js).await;
}

/// Within the duplicate window (1 s here), a republished copy is dropped by JetStream (its ack
/// says duplicate); a copy published after it is stored, delivered, and answered by the inbox from
/// the receipt.
#[tokio::test]
async fn the_duplicate_window_drops_a_copy_and_the_inbox_one_after_it() {
    let Some(js) = jetstream().await else { return };
    let names = Names::new();
    names.create(&js, Duration::from_secs(1)).await;
    let rt = Runtime::builder().node("shipping-1").build().unwrap();
    let publisher = JetStreamPublisher::new(js.clone());
    let message = Envelope::new("o-5".to_owned())
        .to_message(names.subject.as_str())
        .unwrap();
    let first = publisher.publish_acked(&message).await.unwrap();
    let copy = publisher.publish_acked(&message).await.unwrap();
    assert!(!first.duplicate);
    assert!(copy.duplicate, "the window drops the copy");
    assert_eq!(copy.sequence, first.sequence);
    assert_eq!(messages_in(&js, &names.stream).await, 1);
    // Past the window (the server forgets the id within a moment of it), the copy is stored.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let late = loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let ack = publisher.publish_acked(&message).await.unwrap();
        if !ack.duplicate {
            break ack;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the duplicate window of 1 s still drops the copy after 5 s"
        );
    };
    assert_ne!(late.sequence, first.sequence);
    assert_eq!(messages_in(&js, &names.stream).await, 2);

    let inbox = Inbox::new("shipping.on_paid").runtime(&rt);
    let mut consumer = consumer(&js, &names, inbox).await;
    let run_counter = AtomicU32::new(0);
    let runs = &run_counter;
    let ship = |order: String| async move {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        Ok::<_, ShipError>(format!("shipped {order} (run {n})"))
    };
    assert_eq!(done(next(&mut consumer, ship).await), "shipped o-5 (run 1)");
    let after = next(&mut consumer, ship).await;
    assert_eq!(after.stream_sequence, late.sequence);
    assert_eq!(done(after), "shipped o-5 (run 1)", "from the receipt");
    assert_eq!(run_counter.load(Ordering::SeqCst), 1, "shipped once");
    assert_eq!(outstanding(&consumer).await, (0, 0));
    names.delete(&js).await;
}

/// A publisher whose n-th publish reaches the stream but whose ack is lost.
struct LosesAck {
    inner: JetStreamPublisher,
    lose: u32,
    publishes: AtomicU32,
    seen: Mutex<Vec<(String, bool)>>,
}

impl Publish for LosesAck {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let n = self.publishes.fetch_add(1, Ordering::SeqCst);
        let ack = self.inner.publish_acked(message).await?;
        self.seen
            .lock()
            .unwrap()
            .push((message.id.clone(), ack.duplicate));
        if n == self.lose {
            return Err(PublishError::Unconfirmed {
                id: message.id.clone(),
                reason: "the ack was lost (injected)".to_owned(),
            });
        }
        Ok(())
    }
}

/// A publish whose ack is lost is unknown, and published again under the same id; JetStream drops
/// the copy and the message is worked once.
#[tokio::test]
async fn a_publish_whose_ack_is_lost_is_republished_under_the_same_id() {
    let Some(js) = jetstream().await else { return };
    let names = Names::new();
    names.create(&js, Duration::from_secs(120)).await;
    let rt = Runtime::builder().node("orders-1").build().unwrap();
    let publisher = LosesAck {
        inner: JetStreamPublisher::new(js.clone()),
        lose: 0,
        publishes: AtomicU32::new(0),
        seen: Mutex::new(Vec::new()),
    };
    let message = Envelope::new("o-6".to_owned())
        .to_message(names.subject.as_str())
        .unwrap();
    let confirms = Confirms {
        timeout: Duration::from_secs(5),
        republishes: 2,
        backoff: Duration::from_millis(10),
    };
    confirms
        .publish(&message, || publisher.publish(&message))
        .await
        .unwrap();
    assert_eq!(
        *publisher.seen.lock().unwrap(),
        [(message.id.clone(), false), (message.id.clone(), true)],
        "republished under the same id, dropped by the duplicate window"
    );
    assert_eq!(messages_in(&js, &names.stream).await, 1);

    let inbox = Inbox::new("shipping.on_paid").runtime(&rt);
    let mut consumer = consumer(&js, &names, inbox).await;
    let run_counter = AtomicU32::new(0);
    let runs = &run_counter;
    let ship = |order: String| async move {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, ShipError>(format!("shipped {order}"))
    };
    assert_eq!(done(next(&mut consumer, ship).await), "shipped o-6");
    assert_eq!(run_counter.load(Ordering::SeqCst), 1);
    assert_eq!(outstanding(&consumer).await, (0, 0));
    names.delete(&js).await;
}

/// A publish to a subject no stream holds is refused, not unconfirmed.
#[tokio::test]
async fn a_publish_without_a_stream_is_refused() {
    let Some(js) = jetstream().await else { return };
    let names = Names::new();
    let message = Envelope::new(1u32)
        .to_message(names.subject.as_str())
        .unwrap();
    let refused = JetStreamPublisher::new(js).publish(&message).await;
    assert!(
        matches!(refused, Err(PublishError::Refused { .. })),
        "{refused:?}"
    );
}

/// An order as a foreign producer sends it: no envelope, its id in `Nats-Msg-Id` only.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Order {
    order: String,
    qty: u32,
}

const NATS_PY: &str = r#"
import asyncio, json, sys
import nats

async def main(url, subject, msg_id):
    nc = await nats.connect(url)
    js = nc.jetstream()
    body = json.dumps({"order": "o-py", "qty": 2}).encode()
    dup = []
    for _ in range(3):
        ack = await js.publish(subject, body, headers={"Nats-Msg-Id": msg_id})
        dup.append(bool(ack.duplicate))
    # Past the stream's duplicate window, the same message once more.
    for _ in range(40):
        await asyncio.sleep(0.25)
        ack = await js.publish(subject, body, headers={"Nats-Msg-Id": msg_id})
        if not ack.duplicate:
            break
    dup.append(bool(ack.duplicate))
    print(json.dumps(dup))
    await nc.close()

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
"#;

/// Python's nats-py publishes one order three times with one `Nats-Msg-Id` (JetStream drops two
/// copies) and once more after the 1 s duplicate window (stored): the Rust consumer works it once.
#[tokio::test]
async fn a_foreign_producer_nats_py_is_worked_once() {
    let Some(js) = jetstream().await else { return };
    let has_nats_py = std::process::Command::new("python3")
        .args(["-c", "import nats"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !has_nats_py {
        samekey::conformance::skipped(
            "install nats-py (pip install nats-py) for the foreign-producer test on NATS",
        );
        return;
    }
    let names = Names::new();
    names.create(&js, Duration::from_secs(1)).await;
    let url = std::env::var("SAMEKEY_NATS_URL").unwrap();
    let msg_id = format!("py-{}", names.stream);
    let out = tokio::task::spawn_blocking({
        let subject = names.subject.clone();
        let msg_id = msg_id.clone();
        move || {
            std::process::Command::new("python3")
                .args(["-c", NATS_PY, &url, &subject, &msg_id])
                .output()
        }
    })
    .await
    .unwrap()
    .expect("python3 runs");
    assert!(
        out.status.success(),
        "nats-py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let duplicates: Vec<bool> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(duplicates, [false, true, true, false]);
    assert_eq!(messages_in(&js, &names.stream).await, 2);

    let rt = Runtime::builder().node("shipping-1").build().unwrap();
    let inbox = Inbox::new("shipping.on_order").runtime(&rt);
    let mut consumer = consumer(&js, &names, inbox).await;
    let run_counter = AtomicU32::new(0);
    let runs = &run_counter;
    let ship = |order: Order| async move {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        Ok::<_, ShipError>(format!("shipped {} x{} (run {n})", order.order, order.qty))
    };
    let first = next(&mut consumer, ship).await;
    assert_eq!(first.message_id.as_deref(), Some(msg_id.as_str()));
    assert_eq!(done(first), "shipped o-py x2 (run 1)");
    assert_eq!(
        done(next(&mut consumer, ship).await),
        "shipped o-py x2 (run 1)"
    );
    assert_eq!(run_counter.load(Ordering::SeqCst), 1, "worked once");
    assert_eq!(outstanding(&consumer).await, (0, 0));
    let key = consumer.inbox().key_of_foreign(&msg_id);
    assert!(
        rt.store().get(&key, rt.now_ms()).await.unwrap().is_some(),
        "recorded under its Nats-Msg-Id"
    );
    names.delete(&js).await;
}
