//! Messages: a producer that retried publishes one callId twice, the consumer's inbox does the work
//! once, its handler's own calls under the message's traceId; a call that publishes two messages has
//! both worked, each once, with identities that its retried attempt repeats; another payload under
//! one identity is a key reuse; the ids survive the broker's attributes; a handler that asks for a
//! redelivery gets one; on SQLite, a redelivery after the consumer restarts is not worked again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use samekey::{idempotent, Classify, ErrorClass, Runtime, TraceId};
use samekey_messaging::{Envelope, Inbox};

#[derive(Debug, PartialEq, thiserror::Error)]
enum ShipError {
    #[error("broker unavailable")]
    Unavailable,
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for ShipError {
    fn classify(&self) -> ErrorClass {
        match self {
            ShipError::Unavailable => ErrorClass::Retryable,
            ShipError::Samekey(e) => e.classify(),
        }
    }
}

/// The broker: what was published, in order.
#[derive(Default)]
struct Broker {
    queue: Mutex<Vec<String>>,
    publishes: AtomicU32,
}

impl Broker {
    /// Takes `message` into the queue.
    fn take<T: serde::Serialize>(&self, message: &Envelope<T>) {
        self.queue
            .lock()
            .unwrap()
            .push(serde_json::to_string(message).unwrap());
    }

    /// Acknowledges a publish: the first one's acknowledgement is lost after the broker took it.
    fn acknowledge(&self) -> Result<(), ShipError> {
        if self.publishes.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(ShipError::Unavailable);
        }
        Ok(())
    }
}

struct Orders {
    rt: Runtime,
    broker: Arc<Broker>,
}

impl Orders {
    /// Publishes "paid": the first publish's acknowledgement is lost after the broker took it, so the
    /// call retries and the broker holds the message twice.
    #[idempotent(key = "order", runtime = &self.rt, backoff = "1ms..2ms")]
    async fn publish_paid(&self, order: &str) -> Result<(), ShipError> {
        self.broker.take(&Envelope::new(order.to_owned()));
        self.broker.acknowledge()
    }
}

struct Shipping {
    rt: Runtime,
}

impl Shipping {
    /// The handler's own call: answers the traceId it runs under.
    #[idempotent(key = "order", runtime = &self.rt)]
    async fn print_label(&self, order: &str) -> Result<TraceId, ShipError> {
        let _ = order;
        Ok(samekey::current().trace_id())
    }
}

#[tokio::test]
async fn a_message_published_twice_is_worked_once() {
    let rt = Runtime::builder().node("orders-1").build().unwrap();
    let broker = Arc::new(Broker::default());
    let orders = Orders {
        rt: rt.clone(),
        broker: broker.clone(),
    };
    let (published, report) = samekey::observe::observed(orders.publish_paid("o-1")).await;
    published.unwrap();
    let call_id = report.unwrap().call_id().clone();
    let deliveries = broker.queue.lock().unwrap().clone();
    assert_eq!(deliveries.len(), 2, "the broker has it twice");

    let inbox = Inbox::new("shipping.on_paid").runtime(&rt);
    let shipping = &Shipping { rt: rt.clone() };
    let shipped_counter = AtomicU32::new(0);
    let shipped = &shipped_counter;
    let labels = &Mutex::new(Vec::new());
    let mut trace_ids = Vec::new();
    for body in deliveries {
        let message: Envelope<String> = serde_json::from_str(&body).unwrap();
        assert_eq!(
            message.call_id, call_id,
            "every attempt published the same callId"
        );
        trace_ids.push(message.trace_id);
        let parcel = inbox
            .deliver(message, |order| async move {
                let n = shipped.fetch_add(1, Ordering::SeqCst) + 1;
                // The handler's own #[idempotent] calls run under the message's traceId.
                let label = shipping.print_label(&order).await?;
                labels.lock().unwrap().push(label);
                Ok::<_, ShipError>(format!("parcel {n} for {order}"))
            })
            .await
            .unwrap();
        assert_eq!(parcel, "parcel 1 for o-1");
    }
    assert_eq!(shipped_counter.load(Ordering::SeqCst), 1, "shipped once");
    assert_eq!(trace_ids[0], trace_ids[1], "one traceId, published twice");
    assert_eq!(
        *labels.lock().unwrap(),
        [trace_ids[0]],
        "the handler's call ran under the message's traceId"
    );
}

#[tokio::test]
async fn the_ids_survive_the_brokers_attributes() {
    let message = Envelope::new(42u32);
    let attributes = message.attributes();
    let read = Envelope::from_attributes(42u32, |name| {
        attributes
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
    })
    .unwrap();
    assert_eq!(read, message);
    assert!(
        Envelope::from_attributes(1u8, |_| None).is_err(),
        "no callId"
    );
}

#[tokio::test]
async fn a_handler_that_asks_for_a_redelivery_runs_again() {
    let rt = Runtime::builder().node("shipping-1").build().unwrap();
    let inbox = Inbox::new("shipping.on_paid").runtime(&rt);
    let message = Envelope::new("o-2".to_owned());
    let run_counter = AtomicU32::new(0);
    let runs = &run_counter;
    let handler = |order: String| async move {
        match runs.fetch_add(1, Ordering::SeqCst) {
            0 => Err(ShipError::Unavailable),
            _ => Ok(format!("shipped {order}")),
        }
    };
    assert_eq!(
        inbox.deliver(message.clone(), handler).await,
        Err(ShipError::Unavailable),
        "nack: the broker redelivers"
    );
    assert_eq!(
        inbox.deliver(message.clone(), handler).await.unwrap(),
        "shipped o-2"
    );
    assert_eq!(
        inbox.deliver(message, handler).await.unwrap(),
        "shipped o-2"
    );
    assert_eq!(run_counter.load(Ordering::SeqCst), 2);
}

/// A message worked once is not worked again when the broker redelivers it after the consumer
/// restarted (a new runtime on the same database, from `open`); the redelivery gets the first outcome.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
async fn a_redelivery_after_a_restart_is_not_worked_again<F, Fut>(open: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Arc<dyn samekey_runtime::Store>>,
{
    let message = Envelope::new("o-4".to_owned());
    let run_counter = AtomicU32::new(0);
    let runs = &run_counter;
    let handler = |order: String| async move {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        Ok::<_, ShipError>(format!("run {n}: shipped {order}"))
    };
    for restart in 0..2 {
        let rt = Runtime::builder()
            .node("shipping-1")
            .shared_store(open().await)
            .build()
            .unwrap();
        let inbox = Inbox::new("shipping.on_paid").runtime(&rt);
        assert_eq!(
            inbox.deliver(message.clone(), handler).await.unwrap(),
            "run 1: shipped o-4",
            "delivery after {restart} restart(s)"
        );
    }
    assert_eq!(run_counter.load(Ordering::SeqCst), 1, "worked once");
    // Another message is worked, on the same database.
    let rt = Runtime::builder()
        .node("shipping-1")
        .shared_store(open().await)
        .build()
        .unwrap();
    let other = Envelope::new("o-5".to_owned());
    let inbox = Inbox::new("shipping.on_paid").runtime(&rt);
    assert_eq!(
        inbox.deliver(other, handler).await.unwrap(),
        "run 2: shipped o-5"
    );
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_a_restart_is_not_worked_again_on_sqlite() {
    use samekey_runtime::store::SqliteStore;

    let dir = std::env::temp_dir().join(format!(
        "samekey-messaging-inbox-{:x}",
        TraceId::new().as_u128()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("inbox.db");
    a_redelivery_after_a_restart_is_not_worked_again(|| async {
        Arc::new(SqliteStore::open(&path).await.unwrap()) as Arc<dyn samekey_runtime::Store>
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_a_restart_is_not_worked_again_on_mysql() {
    use samekey_runtime::store::MySqlStore;

    let Ok(url) = std::env::var("SAMEKEY_MYSQL_URL") else {
        samekey_runtime::conformance::skipped(
            "set SAMEKEY_MYSQL_URL (scripts/services start) to run the inbox on MySQL",
        );
        return;
    };
    a_redelivery_after_a_restart_is_not_worked_again(|| async {
        Arc::new(MySqlStore::connect(&url).await.unwrap()) as Arc<dyn samekey_runtime::Store>
    })
    .await;
}

/// A call that publishes one message per line item; the first attempt's acknowledgement is lost
/// after the broker took both, so the call retries and the broker holds each twice.
struct Invoices {
    rt: Runtime,
    broker: Arc<Broker>,
}

impl Invoices {
    #[idempotent(key = "order", runtime = &self.rt, backoff = "1ms..2ms")]
    async fn publish_lines(&self, order: &str) -> Result<(), ShipError> {
        for item in ["book", "pen"] {
            self.broker.take(&Envelope::new(format!("{order}:{item}")));
        }
        self.broker.acknowledge()
    }

    /// The envelopes of one attempt, as made.
    #[idempotent(key = "order", runtime = &self.rt)]
    async fn make_two(&self, order: &str) -> Result<Vec<Envelope<String>>, ShipError> {
        Ok(vec![
            Envelope::new(format!("{order}:book")),
            Envelope::new(format!("{order}:pen")),
        ])
    }
}

/// The broker's bodies, read back as envelopes.
fn read(bodies: &[String]) -> Vec<Envelope<String>> {
    bodies
        .iter()
        .map(|body| serde_json::from_str(body).unwrap())
        .collect()
}

/// Both messages of one call are worked, once each; a redelivery of either (the retried publish's
/// copy) is answered its own first outcome without running again. Each message's work runs under a
/// callId of its own: the message's for the first, another for the second.
#[tokio::test]
async fn a_call_that_publishes_two_messages_has_both_worked_once() {
    let rt = Runtime::builder().node("orders-1").build().unwrap();
    let broker = Arc::new(Broker::default());
    let invoices = Invoices {
        rt: rt.clone(),
        broker: broker.clone(),
    };
    invoices.publish_lines("o-7").await.unwrap();
    let deliveries = read(&broker.queue.lock().unwrap());
    assert_eq!(deliveries.len(), 4, "two messages, published twice");

    let inbox = Inbox::new("billing.on_line").runtime(&rt);
    let worked = &Mutex::new(Vec::new());
    let mut answers = Vec::new();
    for message in deliveries.iter().cloned() {
        let answer = inbox
            .deliver(message, |line| async move {
                let call_id = samekey::current().call_id().to_string();
                worked.lock().unwrap().push((line.clone(), call_id));
                Ok::<_, ShipError>(format!("billed {line}"))
            })
            .await
            .unwrap();
        answers.push(answer);
    }
    assert_eq!(
        answers,
        [
            "billed o-7:book",
            "billed o-7:pen",
            "billed o-7:book",
            "billed o-7:pen"
        ],
        "each delivery answered its own message's outcome"
    );
    let worked = worked.lock().unwrap().clone();
    let lines: Vec<&str> = worked.iter().map(|(line, _)| line.as_str()).collect();
    assert_eq!(lines, ["o-7:book", "o-7:pen"], "each worked once");
    let produced = &deliveries[0].call_id;
    assert_ne!(
        worked[0].1,
        produced.to_string(),
        "the work never runs under the producer's own callId"
    );
    assert!(
        worked[0]
            .1
            .starts_with(&format!("{}.0-", produced.prefix())),
        "the first message's work: {}",
        worked[0].1
    );
    assert_ne!(worked[0].1, worked[1].1, "two calls, two callIds");
    let first = &deliveries[0].call_id;
    let second: samekey::CallId = worked[1].1.parse().unwrap();
    assert_eq!(
        (second.prefix(), second.unix_ms(), second.node()),
        (
            format!("{}.1", first.prefix()).as_str(),
            first.unix_ms(),
            first.node()
        ),
        "the second message's work: the callId with its seq after the prefix"
    );
}

/// Reads the callId its call runs under.
struct Probe {
    rt: Runtime,
}

impl Probe {
    #[idempotent(key = "n", scope = "messages.probe", runtime = &self.rt)]
    async fn call_id(&self, n: u64) -> Result<String, ShipError> {
        Ok(samekey::current().call_id().to_string())
    }
}

/// A callId whose prefix is as long as allowed gives the work of its later messages a callId all
/// the same (the prefix shortened), one per message.
#[tokio::test]
async fn a_long_prefix_still_makes_a_call_id_per_message() {
    let rt = Runtime::builder().node("billing-1").build().unwrap();
    let inbox = Inbox::new("billing.on_line").runtime(&rt);
    let call_id = samekey::CallId::new(&"p".repeat(32), "orders-1").unwrap();
    let seen = &Mutex::new(Vec::new());
    for seq in [0, 7, 12345678901234567890] {
        let message = Envelope {
            call_id: call_id.clone(),
            seq,
            trace_id: TraceId::new(),
            traceparent: None,
            payload: seq,
        };
        let worked = inbox
            .deliver(message, |seq| async move {
                seen.lock()
                    .unwrap()
                    .push(samekey::current().call_id().clone());
                Ok::<_, ShipError>(seq)
            })
            .await
            .unwrap();
        assert_eq!(worked, seq);
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "each worked");
    assert_eq!(seen[0].prefix(), format!("{}.0", "p".repeat(30)));
    assert_eq!(seen[1].prefix(), format!("{}.7", "p".repeat(30)));
    assert_eq!(
        seen[2].prefix(),
        format!("{}.12345678901234567890", "p".repeat(11))
    );
    assert!(seen
        .iter()
        .all(|id| id.unix_ms() == call_id.unix_ms() && id.node() == call_id.node()));
    // A chain of works, each the producer of the next, its prefix cut to fit: never a callId twice.
    let probe = Probe {
        rt: Runtime::builder().node("probe").build().unwrap(),
    };
    let mut chain = vec![call_id.clone()];
    for _ in 0..40 {
        let last = chain.last().unwrap().clone();
        let work = samekey_messaging::Envelope {
            call_id: last,
            seq: 0,
            trace_id: TraceId::new(),
            traceparent: None,
            payload: (),
        };
        let n = chain.len() as u64;
        let next: samekey::CallId = work
            .inbound()
            .scope(probe.call_id(n))
            .await
            .unwrap()
            .parse()
            .unwrap();
        assert!(!chain.contains(&next), "{next} came back");
        chain.push(next);
    }
}

/// The retried attempt makes the same messages with the same identities (so a republished copy is
/// a redelivery); the two messages of one attempt have identities of their own, in the body and in
/// the attributes.
#[tokio::test]
async fn a_retried_publish_carries_the_same_identities() {
    let rt = Runtime::builder().node("orders-1").build().unwrap();
    let broker = Arc::new(Broker::default());
    let invoices = Invoices {
        rt: rt.clone(),
        broker: broker.clone(),
    };
    invoices.publish_lines("o-8").await.unwrap();
    let bodies = broker.queue.lock().unwrap().clone();
    let deliveries = read(&bodies);
    let attributes: Vec<_> = deliveries.iter().map(|m| m.attributes()).collect();
    assert_eq!(bodies[0], bodies[2], "the book, twice, the same");
    assert_eq!(bodies[1], bodies[3], "the pen, twice, the same");
    assert_eq!(attributes[0], attributes[2]);
    assert_eq!(attributes[1], attributes[3]);
    assert_ne!(
        attributes[0], attributes[1],
        "two messages of one attempt, two identities"
    );
    let seqs: Vec<serde_json::Value> = bodies
        .iter()
        .map(|body| serde_json::from_str::<serde_json::Value>(body).unwrap()["seq"].clone())
        .collect();
    assert_eq!(seqs, [0, 1, 0, 1], "numbered from 0 in each attempt");
    let seq_attribute = |attributes: &[(&str, String)]| {
        attributes
            .iter()
            .find(|(name, _)| *name == "x-message-seq")
            .map(|(_, value)| value.clone())
    };
    assert_eq!(seq_attribute(&attributes[1]).as_deref(), Some("1"));

    // Read back from the attributes alone; an old envelope without a seq reads as the first.
    let second = &deliveries[1];
    let read_back = Envelope::from_attributes(second.payload.clone(), |name| {
        attributes[1]
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
    })
    .unwrap();
    assert_eq!(&read_back, second);
    let mut old: serde_json::Value = serde_json::from_str(&bodies[0]).unwrap();
    old.as_object_mut().unwrap().remove("seq");
    let old: Envelope<String> = serde_json::from_value(old).unwrap();
    assert_eq!(old, deliveries[0]);
    let bad = Envelope::from_attributes(1u8, |name| match name {
        "x-message-seq" => Some("one".to_owned()),
        _ => attributes[0]
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone()),
    });
    assert!(bad.is_err(), "a seq that is not a number");

    // Another attempt, made apart, numbers its messages alike.
    let made = invoices.make_two("o-9").await.unwrap();
    assert_eq!(
        made[0].attributes()[0],
        made[1].attributes()[0],
        "one callId"
    );
    assert_ne!(made[0].attributes(), made[1].attributes());
}

/// A delivery with the identity of a message already worked but another payload is a reuse of that
/// identity, not a redelivery: `KeyReuse`, and nothing runs; the real redelivery is replayed.
#[tokio::test]
async fn another_payload_under_one_identity_is_key_reuse() {
    let rt = Runtime::builder().node("shipping-1").build().unwrap();
    let inbox = Inbox::new("shipping.on_paid").runtime(&rt);
    let message = Envelope::new("o-10".to_owned());
    let run_counter = AtomicU32::new(0);
    let runs = &run_counter;
    let handler = |order: String| async move {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, ShipError>(format!("shipped {order}"))
    };
    assert_eq!(
        inbox.deliver(message.clone(), handler).await.unwrap(),
        "shipped o-10"
    );
    let forged = Envelope {
        payload: "o-11".to_owned(),
        ..message.clone()
    };
    let reused = inbox.deliver(forged, handler).await;
    assert!(
        matches!(
            reused,
            Err(ShipError::Samekey(samekey::Error::KeyReuse { .. }))
        ),
        "{reused:?}"
    );
    assert_eq!(
        inbox.deliver(message, handler).await.unwrap(),
        "shipped o-10"
    );
    assert_eq!(run_counter.load(Ordering::SeqCst), 1, "worked once");

    // The same payload read back into a map of another order is the same payload: a redelivery.
    let lines: HashMap<String, u32> = (0..32).map(|n| (format!("line-{n}"), n)).collect();
    let message = Envelope::new(lines);
    let body = serde_json::to_string(&message).unwrap();
    let handler = |lines: HashMap<String, u32>| async move {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, ShipError>(lines.len())
    };
    assert_eq!(inbox.deliver(message, handler).await.unwrap(), 32);
    for _ in 0..4 {
        let redelivered: Envelope<HashMap<String, u32>> = serde_json::from_str(&body).unwrap();
        assert_eq!(inbox.deliver(redelivered, handler).await.unwrap(), 32);
    }
    assert_eq!(run_counter.load(Ordering::SeqCst), 2, "worked once more");
}

/// W3C trace context in messages: a message published by a call under an inbound `traceparent`
/// carries it, in its body and its attributes, the same on the retried publish; the inbox adopts it
/// (the handler's call runs under its trace-id and passes it on); read from attributes, a valid
/// `traceparent` wins over `x-trace-id` and a malformed one is ignored.
#[tokio::test]
async fn a_traceparent_is_carried_and_adopted() {
    use samekey::context::InboundCall;
    use samekey::TraceParent;
    let inbound: TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        .parse()
        .unwrap();
    let rt = Runtime::builder().node("orders-1").build().unwrap();
    let broker = Arc::new(Broker::default());
    let orders = Orders {
        rt: rt.clone(),
        broker: broker.clone(),
    };
    InboundCall::new()
        .trace_id(TraceId::new())
        .traceparent(inbound)
        .scope(orders.publish_paid("o-20"))
        .await
        .unwrap();
    let bodies = broker.queue.lock().unwrap().clone();
    assert_eq!(bodies.len(), 2, "published twice");
    assert_eq!(
        bodies[0], bodies[1],
        "the same message, traceparent and all"
    );
    let json: serde_json::Value = serde_json::from_str(&bodies[0]).unwrap();
    assert_eq!(json["traceparent"], inbound.to_string());
    let messages = read(&bodies);
    assert_eq!(messages[0].trace_id, inbound.trace_id());
    assert!(messages[0]
        .attributes()
        .contains(&("traceparent", inbound.to_string())));

    // The consumer: its handler's call runs under the trace-id and passes the traceparent on.
    let shipping = Inbox::new("shipping.on_traced").runtime(&rt);
    let seen = Mutex::new(None);
    let seen = &seen;
    let message = messages[0].clone();
    shipping
        .deliver(message, |order| async move {
            let cx = samekey::current();
            *seen.lock().unwrap() = Some((cx.trace_id(), cx.traceparent()));
            Ok::<_, ShipError>(order)
        })
        .await
        .unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        Some((inbound.trace_id(), inbound)),
        "adopted and passed on unchanged"
    );

    // From attributes: the traceparent wins over a disagreeing x-trace-id; a body whose two
    // disagree is delivered under the traceparent's trace too.
    let other = TraceId::new().to_string();
    let attributes = [
        ("x-call-id", messages[0].call_id.to_string()),
        ("x-trace-id", other.clone()),
        ("traceparent", inbound.to_string()),
    ];
    let get = |attributes: &[(&str, String)], name: &str| {
        attributes
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
    };
    let read_back = Envelope::from_attributes(1u8, |n| get(&attributes, n)).unwrap();
    assert_eq!(read_back.trace_id, inbound.trace_id());
    assert_eq!(read_back.traceparent, Some(inbound));
    let mut disagreeing = read_back.clone();
    disagreeing.trace_id = other.parse().unwrap();
    let under = disagreeing
        .inbound()
        .scope(async { samekey::context::outbound_traceparent() })
        .await;
    assert_eq!(under, Some(inbound));

    // A malformed traceparent is ignored (the trace restarts from x-trace-id); a malformed
    // x-trace-id is still an error.
    let malformed = [
        ("x-call-id", messages[0].call_id.to_string()),
        ("x-trace-id", other.clone()),
        ("traceparent", inbound.to_string().to_uppercase()),
    ];
    let read_back = Envelope::from_attributes(1u8, |n| get(&malformed, n)).unwrap();
    assert_eq!(read_back.trace_id.to_string(), other);
    assert_eq!(read_back.traceparent, None);
    let bad_trace = [
        ("x-call-id", messages[0].call_id.to_string()),
        ("x-trace-id", "not-a-trace".to_owned()),
        ("traceparent", inbound.to_string()),
    ];
    assert!(Envelope::from_attributes(1u8, |n| get(&bad_trace, n)).is_err());
}
