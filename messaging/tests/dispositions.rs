//! `Inbox::handle` on the memory store: what a consumer tells the broker about each delivery, judged by
//! the store's record — ack once worked (and for every redelivery, answered from the receipt), requeue
//! with a growing delay and dead-letter after `max_deliveries`, dead-letter a permanent failure or an
//! unreadable body at once, busy while another delivery works the message, ack an uncertain outcome
//! (compensation owns it); a foreign producer's message known by its message id; the journal.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use samekey::at_most_once::AtMostOnce;
use samekey::journal::EventKind;
use samekey::limits::ConcurrencyLimit;
use samekey::{Classify, ErrorClass, ReceiptState, Runtime};
use samekey_messaging::{Delivery, Disposition, Envelope, Handled, Inbox, Message};

#[derive(Debug, thiserror::Error)]
enum ShipError {
    #[error("the carrier is down")]
    CarrierDown,
    #[error("no such address")]
    NoSuchAddress,
    #[error("the carrier did not answer")]
    NoAnswer,
    #[error("the carrier asks us to slow down")]
    Throttled,
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for ShipError {
    fn classify(&self) -> ErrorClass {
        match self {
            ShipError::CarrierDown => ErrorClass::Retryable,
            ShipError::NoSuchAddress => ErrorClass::Permanent,
            ShipError::NoAnswer => ErrorClass::Unknown,
            ShipError::Throttled => ErrorClass::RateLimited { retry_after: None },
            ShipError::Samekey(e) => e.classify(),
        }
    }
}

fn runtime() -> Runtime {
    Runtime::builder().node("shipping-1").build().unwrap()
}

fn message(order: &str) -> Message {
    Envelope::new(order.to_owned())
        .to_message("orders.charged")
        .unwrap()
}

fn delivery(message: &Message, redelivered: bool) -> Delivery<'_> {
    Delivery {
        message_id: Some(&message.id),
        redelivered,
        ..Delivery::new(&message.body, &message.headers)
    }
}

/// The journal's `Delivered` events of `key`: (disposition, redelivered).
async fn delivered(rt: &Runtime, key: &samekey::key::Key) -> Vec<(String, bool)> {
    rt.history_of_key(key)
        .await
        .unwrap()
        .events
        .into_iter()
        .filter_map(|e| match e.what {
            EventKind::Delivered {
                disposition,
                redelivered,
                ..
            } => Some((disposition, redelivered)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_redelivery_is_acked_from_the_receipt_and_journaled() {
    let rt = runtime();
    let inbox = Inbox::new("shipping.on_charged").runtime(&rt);
    let message = message("o-1");
    let runs = &AtomicU32::new(0);
    for redelivered in [false, true, true] {
        let handled = inbox
            .handle(
                &delivery(&message, redelivered),
                |order: String| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, ShipError>(format!("shipped {order}"))
                },
            )
            .await;
        assert_eq!(handled.disposition(), Disposition::Ack);
        assert!(matches!(handled, Handled::Done(ref r) if r == "shipped o-1"));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "worked once");
    let envelope: Envelope<String> = serde_json::from_slice(&message.body).unwrap();
    let key = inbox.key_of(&envelope);
    assert_eq!(
        delivered(&rt, &key).await,
        vec![("ack".to_owned(), true), ("ack".to_owned(), true)],
        "the first delivery writes nothing; each redelivery is journaled"
    );
    let history = rt.history_of_key(&key).await.unwrap();
    let receipt = history.receipt.expect("the receipt");
    assert!(
        history
            .events
            .iter()
            .filter(|e| matches!(e.what, EventKind::Delivered { .. }))
            .all(|e| e.call_id == receipt.call_id),
        "the deliveries are journaled under the work's callId"
    );
}

#[tokio::test]
async fn a_retryable_failure_is_requeued_with_a_growing_delay_then_dead_lettered() {
    let rt = runtime();
    let inbox = Inbox::new("shipping.on_charged")
        .runtime(&rt)
        .max_deliveries(3);
    let message = message("o-2");
    let runs = AtomicU32::new(0);
    let mut dispositions = Vec::new();
    for n in 0..3 {
        let handled = inbox
            .handle(&delivery(&message, n > 0), |_: String| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Err::<String, _>(ShipError::CarrierDown)
            })
            .await;
        dispositions.push(handled.disposition());
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "each requeued delivery ran again"
    );
    assert!(matches!(&dispositions[0],
        Disposition::Requeue { delay, .. } if *delay == Duration::from_millis(100)));
    assert!(matches!(&dispositions[1],
        Disposition::Requeue { delay, .. } if *delay == Duration::from_millis(200)));
    match &dispositions[2] {
        Disposition::DeadLetter { reason } => {
            assert!(reason.contains("the carrier is down"), "{reason}");
            assert!(reason.contains("3 deliveries"), "{reason}");
        }
        other => panic!("the third delivery must be dead-lettered, not {other:?}"),
    }
}

#[tokio::test]
async fn a_permanent_failure_is_dead_lettered_at_once_and_its_redelivery_too() {
    let rt = runtime();
    let inbox = Inbox::new("shipping.on_charged").runtime(&rt);
    let message = message("o-3");
    let runs = AtomicU32::new(0);
    for redelivered in [false, true] {
        let handled = inbox
            .handle(&delivery(&message, redelivered), |_: String| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Err::<String, _>(ShipError::NoSuchAddress)
            })
            .await;
        assert!(
            matches!(handled.disposition(), Disposition::DeadLetter { ref reason } if reason.contains("no such address")),
            "{:?}",
            handled.disposition()
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the failure is recorded, not run again"
    );
}

#[tokio::test]
async fn an_uncertain_outcome_is_acked_for_compensation() {
    let rt = runtime();
    let inbox = Inbox::new("shipping.on_charged").runtime(&rt);
    let message = message("o-4");
    let handled = inbox
        .handle(&delivery(&message, false), |_: String| async {
            Err::<String, _>(ShipError::NoAnswer)
        })
        .await;
    assert_eq!(handled.disposition(), Disposition::Ack);
    let envelope: Envelope<String> = serde_json::from_slice(&message.body).unwrap();
    let record = rt
        .store()
        .get(&inbox.key_of(&envelope), rt.now_ms())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, ReceiptState::Unknown);
    assert_eq!(
        rt.compensations().await.unwrap().len(),
        1,
        "queued for compensation"
    );
}

#[tokio::test]
async fn unreadable_messages_are_dead_lettered_and_nothing_runs() {
    let rt = runtime();
    let inbox = Inbox::new("shipping.on_charged").runtime(&rt);
    let headers = vec![];
    let cases: [(&[u8], Option<&str>); 3] = [
        (b"not json", Some("m-1")),
        (b"42", Some("m-2")), // JSON, but not the handler's payload (a string)
        (b"\"o-5\"", None),   // the payload, but no identity anywhere
    ];
    for (body, message_id) in cases {
        let delivery = Delivery {
            message_id,
            ..Delivery::new(body, &headers)
        };
        let handled = inbox
            .handle(&delivery, |_: String| async {
                panic!("an unreadable message must not run");
                #[allow(unreachable_code)]
                Ok::<String, ShipError>(String::new())
            })
            .await;
        assert!(matches!(handled, Handled::Unreadable { .. }));
        assert!(matches!(
            handled.disposition(),
            Disposition::DeadLetter { .. }
        ));
    }
}

#[tokio::test]
async fn a_foreign_producers_repeats_are_worked_once_by_message_id() {
    let rt = runtime();
    let inbox = Inbox::new("shipping.on_charged").runtime(&rt);
    let headers = vec![("content-type".to_owned(), "application/json".to_owned())];
    let runs = &AtomicU32::new(0);
    for (id, redelivered) in [
        ("py-1", false),
        ("py-1", false),
        ("py-1", true),
        ("py-2", false),
    ] {
        let delivery = Delivery {
            message_id: Some(id),
            redelivered,
            ..Delivery::new(b"\"o-6\"", &headers)
        };
        let handled = inbox
            .handle(&delivery, |order: String| async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                Ok::<_, ShipError>(format!("run {n}: {order}"))
            })
            .await;
        assert_eq!(handled.disposition(), Disposition::Ack);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "py-1 once, py-2 once");
    assert!(rt
        .store()
        .get(&inbox.key_of_foreign("py-1"), rt.now_ms())
        .await
        .unwrap()
        .is_some_and(|r| r.state == ReceiptState::Success));
}

#[tokio::test]
async fn ids_in_the_headers_serve_a_body_that_lost_its_envelope() {
    let rt = runtime();
    let inbox = Inbox::new("shipping.on_charged").runtime(&rt);
    let message = message("o-7");
    let envelope: Envelope<String> = serde_json::from_slice(&message.body).unwrap();
    // A bridge re-serialized the body as the bare payload; the headers kept the ids.
    let bare = serde_json::to_vec(&envelope.payload).unwrap();
    let runs = AtomicU32::new(0);
    for body in [&message.body, &bare] {
        let handled = inbox
            .handle(&Delivery::new(body, &message.headers), |_: String| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ShipError>(())
            })
            .await;
        assert_eq!(handled.disposition(), Disposition::Ack);
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the same message, by its headers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_while_another_works_the_message_is_busy() {
    let rt = Runtime::builder()
        .node("shipping-1")
        .busy_wait(Duration::from_millis(50))
        .build()
        .unwrap();
    let inbox = Inbox::new("shipping.on_charged").runtime(&rt);
    let message = message("o-8");
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let first = async {
        inbox
            .handle(&delivery(&message, false), |_: String| async move {
                let _ = started_tx.send(());
                let _ = release_rx.await;
                Ok::<_, ShipError>("shipped".to_owned())
            })
            .await
    };
    let second = async {
        started_rx.await.unwrap();
        let handled = inbox
            .handle(&delivery(&message, true), |_: String| async {
                panic!("the message is being worked");
                #[allow(unreachable_code)]
                Ok::<_, ShipError>("twice".to_owned())
            })
            .await;
        let _ = release_tx.send(());
        handled
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(first.disposition(), Disposition::Ack);
    assert!(
        matches!(second.disposition(), Disposition::Busy { .. }),
        "{:?}",
        second.disposition()
    );
}

#[tokio::test]
async fn a_message_moved_back_from_the_dead_letters_gets_its_deliveries_again() {
    let rt = runtime();
    let inbox = Inbox::new("shipping.on_charged")
        .runtime(&rt)
        .max_deliveries(2);
    let message = message("o-9");
    let fail = |_: String| async { Err::<String, _>(ShipError::CarrierDown) };
    let first = inbox.handle(&delivery(&message, false), fail).await;
    assert!(matches!(first.disposition(), Disposition::Requeue { .. }));
    let second = inbox.handle(&delivery(&message, true), fail).await;
    assert!(matches!(
        second.disposition(),
        Disposition::DeadLetter { .. }
    ));
    // An operator moves it back once the carrier is up again: its first new delivery is not the
    // third of a message already given up, and a failure is requeued again.
    let again = inbox.handle(&delivery(&message, false), fail).await;
    assert!(
        matches!(again.disposition(), Disposition::Requeue { .. }),
        "{:?}",
        again.disposition()
    );
    let shipped = inbox
        .handle(&delivery(&message, true), |order: String| async move {
            Ok::<_, ShipError>(order)
        })
        .await;
    assert_eq!(shipped.disposition(), Disposition::Ack);
}

/// Found by the simulation (seeds 1 698 993 650 and 1 698 998 912): a consumer whose runtime's
/// concurrency limit had fallen to 1, its one place held by a long call, had every delivery of a
/// message refused `Overloaded` before the handler — and counted each toward `max_deliveries`, so the
/// message was dead-lettered never worked. A refusal of samekey's own before the handler is deferred,
/// not counted; the message is worked once a place frees up.
#[tokio::test]
async fn a_delivery_the_consumers_own_limit_refuses_is_deferred_never_dead_lettered() {
    static THROTTLED: AtMostOnce = AtMostOnce::new("shipping.quote").retries(0);
    static HOLD: AtMostOnce = AtMostOnce::new("shipping.label");
    let rt = Runtime::builder()
        .node("shipping-1")
        .concurrency_limit(ConcurrencyLimit::adaptive().max_wait(Duration::from_millis(10)))
        .build()
        .unwrap();
    // The carrier's "slow down" lowers the runtime's limit to 1 …
    let throttled = THROTTLED
        .key("q-1")
        .runtime(&rt)
        .run(|| async { Err::<u64, _>(ShipError::Throttled) })
        .await;
    assert!(
        matches!(throttled, Err(ShipError::Throttled)),
        "{throttled:?}"
    );
    assert_eq!(rt.concurrency_limit(None), Some(1));
    // … and a long call holds that one place.
    let release = Arc::new(tokio::sync::Notify::new());
    let holder = tokio::spawn({
        let (rt, release) = (rt.clone(), release.clone());
        async move {
            HOLD.key("l-1")
                .runtime(&rt)
                .run(|| async {
                    release.notified().await;
                    Ok::<u64, ShipError>(1)
                })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(1)).await;

    let inbox = Inbox::new("shipping.on_charged")
        .runtime(&rt)
        .max_deliveries(3);
    let message = message("o-11");
    let runs = AtomicU32::new(0);
    let ship = |_: String| async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, ShipError>("shipped".to_owned())
    };
    for n in 0..10 {
        let handled = inbox.handle(&delivery(&message, n > 0), ship).await;
        match handled.disposition() {
            Disposition::Deferred { reason, delay } => {
                assert!(reason.contains("rate limited"), "{reason}");
                assert!(delay >= Duration::from_secs(1), "{delay:?}");
            }
            other => panic!("delivery {n} of a message the limit refused: {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    let envelope: Envelope<String> = serde_json::from_slice(&message.body).unwrap();
    let key = inbox.key_of(&envelope);
    assert!(
        delivered(&rt, &key).await.is_empty(),
        "deferred deliveries are not journaled: nothing to count"
    );

    release.notify_one();
    assert_eq!(holder.await.unwrap().unwrap(), 1);
    let handled = inbox.handle(&delivery(&message, true), ship).await;
    assert_eq!(handled.disposition(), Disposition::Ack);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "worked once the place freed up"
    );
}
