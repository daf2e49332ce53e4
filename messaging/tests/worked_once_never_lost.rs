//! A message is worked once and never lost, whatever the broker and the publisher do: the inbox, the
//! publishers and the outbox never act twice, drop a message or answer wrong — a refusal after a lost
//! confirm stays unconfirmed, an uncertain outcome under `OnUnknown::Rerun` is given back to be
//! worked, a reused identity with another payload is not acked, `max_deliveries` is reached, foreign
//! ids stay messages of their own, a consumer that died mid-work is taken over. Six of these failed
//! when written and pass since; the others guard behaviour that was probed and held.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use samekey::{idempotent, Classify, ErrorClass, ReceiptState, Runtime};
use samekey_messaging::{
    Confirms, Delivery, Disposition, Envelope, Handled, Inbox, Message, OnUnknown, PublishError,
};

#[derive(Debug, thiserror::Error)]
enum ShipError {
    #[error("the carrier is down")]
    CarrierDown,
    #[error("the carrier did not answer")]
    NoAnswer,
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for ShipError {
    fn classify(&self) -> ErrorClass {
        match self {
            ShipError::CarrierDown => ErrorClass::Retryable,
            ShipError::NoAnswer => ErrorClass::Unknown,
            ShipError::Samekey(e) => e.classify(),
        }
    }
}

fn runtime() -> Runtime {
    Runtime::builder().node("review-1").build().unwrap()
}

fn unique(what: &str) -> String {
    format!("{what}-{:x}", samekey::TraceId::new().as_u128() as u64)
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

// ------------------------------------------------------------------------------------------------
// Confirms: a lost confirmation must never turn into a new id.
// ------------------------------------------------------------------------------------------------

/// `Confirms::publish` says "the last error is the caller's: `Unconfirmed` if any send may have
/// reached the broker". A first send whose confirmation is lost (the broker has the message) followed
/// by a republish the broker refuses (a queue at its `x-max-length` with `reject-publish` nacks it, a
/// JetStream stream at its limits) answers `Refused` — class `Retryable`, "known not taken" — though
/// the first send may well have been taken.
#[tokio::test]
async fn a_refusal_after_a_lost_confirm_is_still_unconfirmed() {
    let message = message("o-1");
    let sends = AtomicU32::new(0);
    let confirms = Confirms {
        timeout: Duration::from_secs(1),
        republishes: 2,
        backoff: Duration::from_millis(1),
    };
    let result = confirms
        .publish(&message, || {
            let n = sends.fetch_add(1, Ordering::SeqCst);
            let id = message.id.clone();
            async move {
                if n == 0 {
                    Err(PublishError::Unconfirmed {
                        id,
                        reason: "the connection was lost after the send".into(),
                    })
                } else {
                    Err(PublishError::Refused {
                        id,
                        reason: "basic.nack (queue full)".into(),
                    })
                }
            }
        })
        .await;
    let error = result.unwrap_err();
    assert!(
        matches!(error, PublishError::Unconfirmed { .. }),
        "the first send may have reached the broker: {error:?} (class {:?})",
        error.classify()
    );
}

/// A broker that takes the first publish but loses its confirmation, then refuses every publish
/// (its queue is full) until `open` is set.
#[derive(Default)]
struct FullQueue {
    taken: Mutex<Vec<String>>,
    sends: AtomicU32,
    open: std::sync::atomic::AtomicBool,
}

impl FullQueue {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let n = self.sends.fetch_add(1, Ordering::SeqCst);
        if n == 0 || self.open.load(Ordering::SeqCst) {
            self.taken.lock().unwrap().push(message.id.clone());
        }
        if n == 0 {
            return Err(PublishError::Unconfirmed {
                id: message.id.clone(),
                reason: "the connection was lost after the send".into(),
            });
        }
        if self.open.load(Ordering::SeqCst) {
            return Ok(());
        }
        Err(PublishError::Refused {
            id: message.id.clone(),
            reason: "basic.nack: the queue is at its x-max-length (reject-publish)".into(),
        })
    }
}

#[derive(Debug, thiserror::Error)]
enum PayError {
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for PayError {
    fn classify(&self) -> ErrorClass {
        match self {
            PayError::Publish(e) => e.classify(),
            PayError::Samekey(e) => e.classify(),
        }
    }
}

struct Producer {
    rt: Runtime,
    broker: Arc<FullQueue>,
}

impl Producer {
    #[idempotent(key = "order", scope = "review.publish_paid", runtime = &self.rt,
                 retries = 1, backoff = "1ms..2ms")]
    async fn publish_paid(&self, order: &str) -> Result<String, PayError> {
        let message = Envelope::new(order.to_owned())
            .to_message("orders.paid")
            .unwrap();
        let confirms = Confirms {
            timeout: Duration::from_secs(1),
            republishes: 1,
            backoff: Duration::from_millis(1),
        };
        confirms
            .publish(&message, || self.broker.publish(&message))
            .await?;
        Ok(message.id)
    }
}

/// The consequence of the finding above for a producer: its `#[idempotent]` call ends with the
/// refusal, a `Retryable` error, so the core releases the key as "nothing ran" — while the broker
/// holds the first send. The next call for the same order claims the key afresh under a **new
/// callId**, and publishes the same business message under a new message id: the consumer's inbox
/// cannot tell it from a new message and ships the order twice.
#[tokio::test]
async fn a_lost_confirm_then_a_refusal_never_gives_the_message_a_new_id() {
    let broker = Arc::new(FullQueue::default());
    let producer = Producer {
        rt: runtime(),
        broker: broker.clone(),
    };
    let first = producer.publish_paid("o-2").await;
    assert!(first.is_err(), "the queue is full: {first:?}");
    broker.open.store(true, Ordering::SeqCst);
    let _ = producer.publish_paid("o-2").await;
    let taken = broker.taken.lock().unwrap().clone();
    let distinct: HashSet<_> = taken.iter().collect();
    assert_eq!(
        distinct.len(),
        1,
        "one business message, one identity; the broker holds {taken:?}"
    );
}

// ------------------------------------------------------------------------------------------------
// Inbox: dispositions.
// ------------------------------------------------------------------------------------------------

/// The inbox's table says a reused identity is `FAILED` → dead-letter. It is not: `KeyReuse` leaves
/// the earlier message's record as it was (`SUCCESS`), and `after_failure` reads `SUCCESS` → `Ack`.
/// A *different* message (another payload) under an identity already used — a foreign producer
/// whose message ids repeat (a counter restarted), two producers sharing a callId — is acked and
/// dropped without being worked, and without a dead letter anyone could look at.
#[tokio::test]
async fn a_reused_identity_with_another_payload_is_not_silently_acked() {
    let rt = runtime();
    let inbox = Inbox::new(unique("review.reuse")).runtime(&rt);
    let headers = vec![];
    let runs = &AtomicU32::new(0);
    let mut dispositions = Vec::new();
    for body in [&b"\"o-3\""[..], &b"\"o-4\""[..]] {
        let delivery = Delivery {
            message_id: Some("py-7"),
            ..Delivery::new(body, &headers)
        };
        let handled = inbox
            .handle(&delivery, |order: String| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ShipError>(order)
            })
            .await;
        dispositions.push((handled.disposition(), format!("{handled:?}")));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(
        matches!(dispositions[1].0, Disposition::DeadLetter { .. }),
        "o-4 was never worked; it must reach the dead letters, not be acked: {:?}",
        dispositions[1]
    );
}

/// With [`OnUnknown::Rerun`] ("runs the handler again under the same callId") a handler whose outcome
/// is uncertain (its error is classified `Unknown`: a database commit that timed out, as the example's
/// `PipelineError::Database`) is recorded `UNKNOWN` and **acked**: the broker never redelivers it, so
/// the take-over that `Rerun` allows never comes. The message is lost to a compensation entry that has
/// no lookup and no reversal (escalated `MANUAL` in the end). With `Rerun` an `UNKNOWN` record should
/// be requeued, so that the next delivery takes it over and works it.
#[tokio::test]
async fn a_rerun_inbox_gives_an_uncertain_message_back_to_be_worked() {
    let rt = runtime();
    let inbox = Inbox::new(unique("review.rerun"))
        .runtime(&rt)
        .on_unknown(OnUnknown::Rerun);
    let message = message("o-5");
    let runs = &AtomicU32::new(0);
    let first = inbox
        .handle(&delivery(&message, false), |_: String| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Err::<String, _>(ShipError::NoAnswer)
        })
        .await;
    let disposition = first.disposition();
    // What would happen on a redelivery: the take-over re-runs it.
    let again = inbox
        .handle(&delivery(&message, true), |order: String| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ShipError>(order)
        })
        .await;
    assert!(
        matches!(again, Handled::Done(_)),
        "a redelivery is worked under Rerun: {again:?}"
    );
    assert!(
        !matches!(disposition, Disposition::Ack),
        "the first delivery must be given back, not acked (acked: no redelivery ever comes)"
    );
}

/// `max_deliveries` is counted from the journal's `Delivered { requeue }` events, but a key's journal
/// keeps only its latest `JOURNAL_LIMIT` (256) events: past 256 requeues the oldest are dropped and
/// the count stopped growing, so with `max_deliveries(300)` a poison message was requeued for ever and
/// never reached the dead letters. (Busy deliveries were journaled too and pushed requeues out of the
/// same 256.) Now `max_deliveries` is clamped to `MAX_DELIVERIES` (100) and busy deliveries are not
/// journaled.
#[tokio::test]
async fn a_large_max_deliveries_is_reached() {
    let rt = runtime();
    let inbox = Inbox::new(unique("review.poison"))
        .runtime(&rt)
        .max_deliveries(300);
    let message = message("o-6");
    let mut dead_at = None;
    for n in 1..=400u32 {
        let handled = inbox
            .handle(&delivery(&message, n > 1), |_: String| async {
                Err::<String, _>(ShipError::CarrierDown)
            })
            .await;
        if matches!(handled.disposition(), Disposition::DeadLetter { .. }) {
            dead_at = Some(n);
            break;
        }
    }
    assert_eq!(
        dead_at,
        Some(samekey_messaging::MAX_DELIVERIES as u32),
        "max_deliveries(300) is clamped to MAX_DELIVERIES, and that delivery is dead-lettered; \
         dead-lettered at {dead_at:?}"
    );
}

/// A producer in another language that propagates an `X-Call-Id` of its own (a UUID taken from the
/// HTTP request it serves: `X-Call-Id` is a common header name) sends a message with a `message_id`
/// the inbox could deduplicate by; the inbox reads the header as samekey's, finds it invalid and
/// dead-letters every such message, though its `message_id` identifies it.
#[tokio::test]
async fn a_foreign_x_call_id_falls_back_to_the_message_id() {
    let rt = runtime();
    let inbox = Inbox::new(unique("review.foreign")).runtime(&rt);
    let headers = vec![(
        "X-Call-Id".to_owned(),
        "3f6c1f2e-8d4b-4c1e-9a37-0b5d2a6e9c11".to_owned(),
    )];
    let delivery = Delivery {
        message_id: Some("py-42"),
        ..Delivery::new(b"\"o-7\"", &headers)
    };
    let handled = inbox
        .handle(&delivery, |order: String| async move {
            Ok::<_, ShipError>(order)
        })
        .await;
    assert!(
        matches!(handled, Handled::Done(_)),
        "worked once by its message id: {handled:?}"
    );
}

// ------------------------------------------------------------------------------------------------
// Inbox: probes that held.
// ------------------------------------------------------------------------------------------------

/// A foreign message id that spells an envelope's identity (`<callId>/<seq>`, as `Envelope::message_id`
/// makes it) is keyed apart from that envelope: both are worked.
#[tokio::test]
async fn a_foreign_id_that_spells_an_envelope_identity_is_a_message_of_its_own() {
    let rt = runtime();
    let inbox = Inbox::new(unique("review.collide")).runtime(&rt);
    let envelope = message("o-8");
    let runs = &AtomicU32::new(0);
    let handler = |order: String| async move {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, ShipError>(order)
    };
    assert!(matches!(
        inbox.handle(&delivery(&envelope, false), handler).await,
        Handled::Done(_)
    ));
    let headers = vec![];
    let foreign = Delivery {
        message_id: Some(&envelope.id),
        ..Delivery::new(b"\"o-8\"", &headers)
    };
    assert!(matches!(
        inbox.handle(&foreign, handler).await,
        Handled::Done(_)
    ));
    let parsed: Envelope<String> = serde_json::from_slice(&envelope.body).unwrap();
    assert_ne!(
        inbox.key_of(&parsed),
        inbox.key_of_foreign(&envelope.id),
        "an envelope's key and a foreign id's key never meet"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A body whose envelope and headers disagree (a bridge rewrote the headers): the body's ids win, so
/// the same body under other headers is the same message, worked once.
#[tokio::test]
async fn the_body_wins_over_headers_that_disagree() {
    let rt = runtime();
    let inbox = Inbox::new(unique("review.disagree")).runtime(&rt);
    let original = message("o-9");
    let other = message("o-9");
    let runs = &AtomicU32::new(0);
    for headers in [&original.headers, &other.headers] {
        let handled = inbox
            .handle(
                &Delivery {
                    message_id: Some(&other.id),
                    ..Delivery::new(&original.body, headers)
                },
                |order: String| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, ShipError>(order)
                },
            )
            .await;
        assert_eq!(handled.disposition(), Disposition::Ack);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A delivery as a test makes it: body, headers, message id.
type Case = (Vec<u8>, Vec<(String, String)>, Option<String>);

/// Broker input that is odd but valid for the broker — a huge `x-message-seq`, a seq that is no
/// number, a 255-byte foreign id, a body that is not UTF-8, a callId of 32-character prefix — never
/// panics: each is worked or dead-lettered.
#[tokio::test]
async fn odd_broker_input_never_panics() {
    let rt = runtime();
    let inbox = Inbox::new(unique("review.odd")).runtime(&rt);
    let base = message("o-10");
    let call_id = base.header("x-call-id").unwrap().to_owned();
    let long_prefix = format!(
        "{}{}",
        "p".repeat(32),
        &call_id[call_id.find('-').unwrap()..]
    );
    let cases: Vec<Case> = vec![
        (
            b"\"o\"".to_vec(),
            vec![
                ("x-call-id".into(), call_id.clone()),
                ("x-message-seq".into(), u64::MAX.to_string()),
            ],
            None,
        ),
        (
            b"\"o\"".to_vec(),
            vec![
                ("x-call-id".into(), call_id.clone()),
                ("x-message-seq".into(), "-1".into()),
            ],
            None,
        ),
        (
            b"\"o\"".to_vec(),
            vec![("x-call-id".into(), long_prefix)],
            None,
        ),
        (b"\"o\"".to_vec(), vec![], Some("é".repeat(127))),
        (vec![0xff, 0xfe, 0x22], vec![], Some("bin".into())),
        (
            b"\"o\"".to_vec(),
            vec![
                ("x-call-id".into(), call_id.clone()),
                ("traceparent".into(), "00-zz".into()),
                ("x-trace-id".into(), "not a trace".into()),
            ],
            None,
        ),
    ];
    for (body, headers, id) in &cases {
        let delivery = Delivery {
            message_id: id.as_deref(),
            delivery: Some(u64::MAX),
            redelivered: true,
            ..Delivery::new(body, headers)
        };
        let handled = inbox
            .handle(&delivery, |order: String| async move {
                Ok::<_, ShipError>(order)
            })
            .await;
        let _ = handled.disposition();
    }
}

/// A consumer that dies mid-work (its future is never polled again, nor dropped: no guard runs, the
/// lease is not renewed) leaves the message `PROCESSING`: a redelivery while its lease lives is busy
/// and runs nothing; once the lease ended, with the default `Hold` the message goes `UNKNOWN` and is
/// acked without running the handler again; with `Rerun` the handler runs again under the same callId.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_died_mid_work_is_taken_over_as_its_policy_says() {
    for on_unknown in [OnUnknown::Hold, OnUnknown::Rerun] {
        let rt = Runtime::builder()
            .node("review-1")
            .lease(Duration::from_millis(300))
            .busy_wait(Duration::from_millis(20))
            .build()
            .unwrap();
        let inbox = Arc::new(
            Inbox::new(unique("review.died"))
                .runtime(&rt)
                .on_unknown(on_unknown),
        );
        let message = message("o-11");
        let runs = Arc::new(Mutex::new(Vec::<String>::new()));
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let dying = {
            let inbox = inbox.clone();
            let message = message.clone();
            let runs = runs.clone();
            async move {
                inbox
                    .handle(&delivery(&message, false), |_: String| async move {
                        runs.lock()
                            .unwrap()
                            .push(samekey::current().call_id().to_string());
                        let _ = started_tx.send(());
                        std::future::pending::<()>().await;
                        Ok::<_, ShipError>("never".to_owned())
                    })
                    .await
            }
        };
        let mut dying = Box::pin(dying);
        // Poll it until the handler started, then abandon it without dropping it (a SIGKILL).
        tokio::select! {
            _ = &mut dying => unreachable!(),
            _ = started_rx => {}
        }
        std::mem::forget(dying);
        let busy = inbox
            .handle(&delivery(&message, true), |_: String| async {
                panic!("busy: the first worker's lease lives");
                #[allow(unreachable_code)]
                Ok::<String, ShipError>(String::new())
            })
            .await;
        assert!(
            matches!(busy.disposition(), Disposition::Busy { .. }),
            "{on_unknown:?}: {:?}",
            busy.disposition()
        );
        tokio::time::sleep(Duration::from_millis(450)).await;
        let runs2 = runs.clone();
        let after = inbox
            .handle(&delivery(&message, true), |order: String| async move {
                runs2
                    .lock()
                    .unwrap()
                    .push(samekey::current().call_id().to_string());
                Ok::<_, ShipError>(order)
            })
            .await;
        let runs = runs.lock().unwrap().clone();
        let parsed: Envelope<String> = serde_json::from_slice(&message.body).unwrap();
        let record = rt
            .store()
            .get(&inbox.key_of(&parsed), rt.now_ms())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(after.disposition(), Disposition::Ack, "{on_unknown:?}");
        match on_unknown {
            OnUnknown::Hold => {
                assert_eq!(runs.len(), 1, "Hold never runs it again");
                assert_eq!(record.state, ReceiptState::Unknown);
            }
            _ => {
                assert_eq!(runs.len(), 2, "Rerun runs it again");
                assert_eq!(runs[0], runs[1], "under the same callId");
                assert_eq!(record.state, ReceiptState::Success);
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------
// The outbox with `complete_in`: commit or nothing, under a rerun.
// ------------------------------------------------------------------------------------------------

#[cfg(feature = "sqlite")]
mod outbox_rerun {
    use super::*;
    use samekey_messaging::outbox::SqliteOutbox;
    use samekey_runtime::sqlx;
    use samekey_runtime::store::SqliteStore;

    #[derive(Debug, thiserror::Error)]
    enum ChargeError {
        #[error("database: {0}")]
        Database(String),
        #[error(transparent)]
        Samekey(#[from] samekey::Error),
    }

    impl Classify for ChargeError {
        fn classify(&self) -> ErrorClass {
            match self {
                // As the order_pipeline example says: the transaction may or may not have committed.
                ChargeError::Database(_) => ErrorClass::Unknown,
                ChargeError::Samekey(e) => e.classify(),
            }
        }
    }

    fn db(e: impl std::fmt::Display) -> ChargeError {
        ChargeError::Database(e.to_string())
    }

    struct Orders {
        rt: Runtime,
        outbox: SqliteOutbox,
        /// The first COMMIT's answer is lost: it committed, and the call hears an error.
        lose_commit_answer: std::sync::atomic::AtomicBool,
    }

    impl Orders {
        /// The order_pipeline example's charge, on SQLite: the business row (no unique index, as the
        /// example's `pipeline_orders`), the message and the receipt in one transaction; an
        /// uncertain database error is rerun under the same callId.
        #[idempotent(key = "order", scope = "review.outbox.charge", runtime = &self.rt,
                     on_unknown = "rerun", retries = 3, backoff = "1ms..2ms")]
        async fn charge(&self, order: i64) -> Result<i64, ChargeError> {
            let mut tx = self.outbox.pool().begin().await.map_err(db)?;
            sqlx::query("INSERT INTO review_orders (order_id) VALUES ($1)")
                .bind(order)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            let charged = Envelope::new(order);
            self.outbox
                .stage_envelope(&mut tx, "orders.charged", &order.to_string(), &charged)
                .await
                .map_err(db)?;
            SqliteStore::complete_in(&mut tx, &samekey::current(), &order)
                .await
                .map_err(|e| ChargeError::Samekey(samekey::Error::Store(e)))?;
            tx.commit().await.map_err(db)?;
            if self.lose_commit_answer.swap(false, Ordering::SeqCst) {
                return Err(db("connection reset while reading COMMIT's answer"));
            }
            Ok(order)
        }
    }

    /// A COMMIT whose answer is lost (it committed: business row, message and receipt) is an unknown
    /// outcome; under `on_unknown = "rerun"` (the example's charge) the call would run its body again
    /// under the same callId and fence, where `complete_in` answers `Ok(AlreadyApplied)` and a second
    /// business row could commit. Held: before the retry the core renews its lease under the fence,
    /// finds the receipt `SUCCESS`, and answers it without running the body again.
    #[tokio::test]
    async fn a_rerun_after_a_lost_commit_answer_does_not_commit_twice() {
        let dir = std::env::temp_dir().join(unique("samekey-review-outbox"));
        std::fs::create_dir_all(&dir).unwrap();
        let store = SqliteStore::open(dir.join("outbox.db")).await.unwrap();
        let outbox = SqliteOutbox::from_pool(store.pool().clone());
        outbox.migrate().await.unwrap();
        sqlx::query("CREATE TABLE IF NOT EXISTS review_orders (order_id BIGINT)")
            .execute(outbox.pool())
            .await
            .unwrap();
        let orders = Orders {
            rt: Runtime::builder()
                .node("orders-1")
                .store(store.clone())
                .build()
                .unwrap(),
            outbox: outbox.clone(),
            lose_commit_answer: std::sync::atomic::AtomicBool::new(true),
        };
        let charged = orders.charge(7).await;
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM review_orders WHERE order_id = 7")
            .fetch_one(outbox.pool())
            .await
            .unwrap();
        let staged: i64 = sqlx::query_scalar("SELECT count(*) FROM samekey_outbox")
            .fetch_one(outbox.pool())
            .await
            .unwrap();
        store.pool().close().await;
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(staged, 1, "one message");
        assert_eq!(
            rows, 1,
            "the order is charged once (the call answered {charged:?})"
        );
    }
}
