//! Messages: a producer that retried publishes one callId twice, the consumer's inbox does the work
//! once; the ids survive the broker's attributes; a handler that asks for a redelivery gets one.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use samekey::{idempotent, Classify, ErrorClass, Runtime};
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
    let shipped_counter = AtomicU32::new(0);
    let shipped = &shipped_counter;
    for body in deliveries {
        let message: Envelope<String> = serde_json::from_str(&body).unwrap();
        assert_eq!(
            message.call_id, call_id,
            "every attempt published the same callId"
        );
        let parcel = inbox
            .deliver(message, |order| async move {
                let n = shipped.fetch_add(1, Ordering::SeqCst) + 1;
                // The handler's own #[idempotent] calls run under the message's traceId.
                Ok::<_, ShipError>(format!("parcel {n} for {order}"))
            })
            .await
            .unwrap();
        assert_eq!(parcel, "parcel 1 for o-1");
    }
    assert_eq!(shipped_counter.load(Ordering::SeqCst), 1, "shipped once");
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
