//! Messages: a producer that retried publishes one callId twice, the consumer's inbox does the work
//! once, its handler's own calls under the message's traceId; the ids survive the broker's
//! attributes; a handler that asks for a redelivery gets one; on SQLite, a redelivery after the
//! consumer restarts is not worked again.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use samekey::{idempotent, Classify, ErrorClass, Runtime, TraceId};
use samekey_http::{Envelope, Inbox};

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

struct Orders {
    rt: Runtime,
    broker: Arc<Broker>,
}

impl Orders {
    /// Publishes "paid": the first publish's acknowledgement is lost after the broker took it, so the
    /// call retries and the broker holds the message twice.
    #[idempotent(key = "order", runtime = &self.rt, backoff = "1ms..2ms")]
    async fn publish_paid(&self, order: &str) -> Result<(), ShipError> {
        let message = Envelope::new(order.to_owned());
        self.broker
            .queue
            .lock()
            .unwrap()
            .push(serde_json::to_string(&message).unwrap());
        if self.broker.publishes.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(ShipError::Unavailable);
        }
        Ok(())
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
    let (published, report) = samekey::observed(orders.publish_paid("o-1")).await;
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

/// On SQLite: a message worked once is not worked again when the broker redelivers it after the
/// consumer restarted (a new runtime on the same file); the redelivery gets the first outcome.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_a_restart_is_not_worked_again() {
    use samekey_runtime::store::SqliteStore;

    let dir =
        std::env::temp_dir().join(format!("samekey-http-inbox-{:x}", TraceId::new().as_u128()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("inbox.db");
    let message = Envelope::new("o-4".to_owned());
    let run_counter = AtomicU32::new(0);
    let runs = &run_counter;
    let handler = |order: String| async move {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        Ok::<_, ShipError>(format!("run {n}: shipped {order}"))
    };
    for restart in 0..2 {
        let store = SqliteStore::open(&path).await.unwrap();
        let rt = Runtime::builder()
            .node("shipping-1")
            .shared_store(Arc::new(store))
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
    // Another message is worked, on the same file.
    let store = SqliteStore::open(&path).await.unwrap();
    let rt = Runtime::builder()
        .node("shipping-1")
        .shared_store(Arc::new(store))
        .build()
        .unwrap();
    let other = Envelope::new("o-5".to_owned());
    let inbox = Inbox::new("shipping.on_paid").runtime(&rt);
    assert_eq!(
        inbox.deliver(other, handler).await.unwrap(),
        "run 2: shipped o-5"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
