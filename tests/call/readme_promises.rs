//! The first hour with samekey, as a new user spends it: a payments service written from the README
//! alone — a gateway client with its own status type, an error enum holding `io::Error` (no serde), an
//! `Order`, two providers, a store per test — and the mistakes a new user makes on purpose. Each test
//! is one thing the README promises.
//!
//! (Was `tests/first_hour.rs`, "the first hour with samekey".)

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use samekey::{
    clock::TokioClock, idempotent, observe::observed, observe::CallAnswer, Classify, Error,
    ErrorClass, KeyPart, RemoteStatus, Runtime,
};
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------------------------
// The gateway: a payment provider's client, with its own types. It deduplicates by the idempotency
// header it is sent (the callId), as real gateways do, and answers status queries by it.

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct ChargeId(String);

#[derive(Debug)]
enum GatewayError {
    /// 402: the card was declined; nothing was charged.
    Declined,
    /// 503 before processing.
    Unavailable,
    /// 403: the gateway refused the merchant for good; the detail is an I/O-style error.
    Refused(io::Error),
    /// The connection dropped after the request was sent.
    Io(io::Error),
}

/// The gateway's own answer to "what happened to this request?".
enum GatewayStatus {
    Charged(ChargeId),
    Declined,
    Pending,
    NotFound,
}

/// What the next charge request does, scripted by a test.
#[derive(Clone, Copy)]
enum Next {
    Ok,
    Decline,
    Unavailable,
    Refuse,
    /// Charge, then lose the reply.
    LoseReply,
    /// Accept the charge for processing (it settles when its status is asked twice), and lose the
    /// reply.
    Accept,
}

#[derive(Default)]
struct Gateway {
    script: Mutex<Vec<Next>>,
    /// Charges taken, by idempotency header.
    charges: Mutex<BTreeMap<String, (String, String, u64)>>,
    declined: Mutex<Vec<String>>,
    declined_calls: Mutex<Vec<String>>,
    /// Accepted, not settled: call id → (order, status queries so far).
    pending: Mutex<BTreeMap<String, (String, u32)>>,
    requests: AtomicU32,
}

impl Gateway {
    fn script(&self, steps: &[Next]) {
        let mut script = self.script.lock().unwrap();
        script.clear();
        script.extend(steps.iter().rev());
    }

    /// `POST /charges` with `Idempotency-Key: {call_id}`.
    async fn charge(
        &self,
        call_id: &str,
        order_id: &str,
        card: &str,
        cents: u64,
    ) -> Result<ChargeId, GatewayError> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        tokio::task::yield_now().await;
        let next = self.script.lock().unwrap().pop().unwrap_or(Next::Ok);
        let mut charges = self.charges.lock().unwrap();
        if let Some((order, _, _)) = charges.get(call_id) {
            return Ok(ChargeId(format!("ch_{order}")));
        }
        match next {
            Next::Decline => {
                self.declined.lock().unwrap().push(card.to_owned());
                self.declined_calls.lock().unwrap().push(call_id.to_owned());
                Err(GatewayError::Declined)
            }
            Next::Accept => {
                let order = order_id.to_owned();
                self.pending
                    .lock()
                    .unwrap()
                    .insert(call_id.to_owned(), (order, 0));
                Err(GatewayError::Io(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no reply",
                )))
            }
            Next::Unavailable => Err(GatewayError::Unavailable),
            Next::Refuse => Err(GatewayError::Refused(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "merchant account suspended",
            ))),
            Next::Ok | Next::LoseReply => {
                charges.insert(
                    call_id.to_owned(),
                    (order_id.to_owned(), card.to_owned(), cents),
                );
                if matches!(next, Next::LoseReply) {
                    return Err(GatewayError::Io(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        "connection reset by peer",
                    )));
                }
                Ok(ChargeId(format!("ch_{order_id}")))
            }
        }
    }

    /// `GET /charges?idempotency_key={call_id}`.
    async fn status(&self, call_id: &str) -> Result<GatewayStatus, io::Error> {
        let mut charges = self.charges.lock().unwrap();
        let mut pending = self.pending.lock().unwrap();
        if let Some((order, asked)) = pending.get_mut(call_id) {
            *asked += 1;
            if *asked < 2 {
                return Ok(GatewayStatus::Pending);
            }
            let order = order.clone();
            pending.remove(call_id);
            charges.insert(call_id.to_owned(), (order, String::new(), 0));
        }
        if self
            .declined_calls
            .lock()
            .unwrap()
            .iter()
            .any(|c| c == call_id)
        {
            return Ok(GatewayStatus::Declined);
        }
        Ok(match charges.get(call_id) {
            Some((order, _, _)) => GatewayStatus::Charged(ChargeId(format!("ch_{order}"))),
            None => GatewayStatus::NotFound,
        })
    }

    fn charges_for(&self, order_id: &str) -> usize {
        let charges = self.charges.lock().unwrap();
        charges.values().filter(|(o, _, _)| o == order_id).count()
    }
}

// ---------------------------------------------------------------------------------------------
// The service, as the README shows it.

#[derive(Debug, thiserror::Error)]
enum PayError {
    #[error("card declined")]
    Declined,
    #[error("payment gateway unavailable")]
    Unavailable,
    #[error("payment refused by the gateway: {0}")]
    Refused(io::Error),
    #[error("gateway connection failed: {0}")]
    Network(#[from] io::Error),
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for PayError {
    fn classify(&self) -> ErrorClass {
        match self {
            // Nothing was charged: the customer may try this order again with another card.
            PayError::Declined => ErrorClass::Rejected,
            PayError::Unavailable => ErrorClass::Retryable,
            // The answer stands for this order.
            PayError::Refused(_) => ErrorClass::Permanent,
            PayError::Network(e) => e.classify(),
            PayError::Samekey(e) => e.classify(),
        }
    }
}

impl From<GatewayError> for PayError {
    fn from(e: GatewayError) -> PayError {
        match e {
            GatewayError::Declined => PayError::Declined,
            GatewayError::Unavailable => PayError::Unavailable,
            GatewayError::Refused(e) => PayError::Refused(e),
            GatewayError::Io(e) => PayError::Network(e),
        }
    }
}

#[derive(Debug, Clone, KeyPart)]
struct Order {
    id: String,
    #[key_part(skip)]
    cents: u64,
}

fn order(id: &str) -> Order {
    Order {
        id: id.to_owned(),
        cents: 1_250,
    }
}

struct Payments {
    gateway: Arc<Gateway>,
    samekey: Runtime,
}

impl Payments {
    fn new() -> Payments {
        let samekey = Runtime::builder()
            .node("api-7")
            .clock(TokioClock::new())
            .build()
            .expect("a host-style node name is valid");
        Payments {
            gateway: Arc::new(Gateway::default()),
            samekey,
        }
    }

    /// The card is not part of the key: a declined order may be paid with another card.
    #[idempotent(
        key = "order.id + \"charge\"",
        runtime = &self.samekey,
        timeout = "2s",
        lookup = |call| async move {
            Ok::<_, io::Error>(match self.gateway.status(call).await? {
                GatewayStatus::Charged(id) => RemoteStatus::Succeeded(id),
                GatewayStatus::Declined => RemoteStatus::Failed(PayError::Declined),
                GatewayStatus::Pending => RemoteStatus::Processing,
                GatewayStatus::NotFound => RemoteStatus::NotReceived,
            })
        }
    )]
    async fn charge(&self, order: &Order, card: &str) -> Result<ChargeId, PayError> {
        let call = samekey::current();
        Ok(self
            .gateway
            .charge(call.call_id(), &order.id, card, order.cents)
            .await?)
    }

    /// A request id the client may omit: without one, nothing runs.
    #[idempotent(key = "request_id", runtime = &self.samekey)]
    async fn refund(&self, request_id: Option<String>, cents: u64) -> Result<u64, PayError> {
        Ok(cents)
    }

    /// The same, for a caller that accepts running unprotected without a request id.
    #[idempotent(key = "request_id", runtime = &self.samekey, on_missing_key = "run")]
    async fn note(&self, request_id: Option<String>, cents: u64) -> Result<u64, PayError> {
        // Unprotected without a request id: no claim, no receipt, a key shared by all such calls.
        assert_eq!(samekey::current().is_protected(), request_id.is_some());
        Ok(cents)
    }

    /// Acts, then calls `refund` with a request id that may be missing.
    #[idempotent(key = "order.id + \"cancel\"", runtime = &self.samekey)]
    async fn cancel(&self, order: &Order, request_id: Option<String>) -> Result<u64, PayError> {
        self.gateway.requests.fetch_add(1, Ordering::SeqCst);
        self.refund(request_id, order.cents).await
    }
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_host_style_node_name_is_the_call_ids_last_field() {
    let payments = Payments::new();
    assert_eq!(payments.samekey.node(), "api-7");
    let (charged, report) = observed(payments.charge(&order("o-1"), "4242")).await;
    assert!(charged.is_ok());
    let call_id = report.expect("the call is reported").call_id().clone();
    assert_eq!(call_id.node(), "api-7");
    assert!(call_id.to_string().ends_with("-api-7"));
    assert_eq!(
        call_id.to_string().parse::<samekey::CallId>().unwrap(),
        call_id
    );

    let bad = Runtime::builder().node("api 7").build().unwrap_err();
    assert_eq!(
        bad.to_string(),
        "invalid node name (`Runtime::builder().node(...)`) `api 7`: a node name may only hold ASCII letters, digits, `_`, `.` and `-`"
    );
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_is_told_it_is_a_replay_and_gets_the_first_calls_id() {
    let payments = Payments::new();
    let (first, first_report) = observed(payments.charge(&order("o-2"), "4242")).await;
    let (second, second_report) = observed(payments.charge(&order("o-2"), "4242")).await;
    let (first_report, second_report) = (first_report.unwrap(), second_report.unwrap());
    assert_eq!(first.unwrap(), second.unwrap());
    assert_eq!(first_report.answer(), CallAnswer::Executed);
    assert!(!first_report.replayed());
    assert_eq!(first_report.attempts(), 1);
    assert_eq!(second_report.answer(), CallAnswer::Replayed);
    assert!(second_report.replayed());
    assert_eq!(second_report.attempts(), 0);
    assert_eq!(second_report.call_id(), first_report.call_id());
    assert_eq!(second_report.key(), first_report.key());
    assert_eq!(payments.gateway.charges_for("o-2"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_declined_card_leaves_the_order_payable_with_another_card() {
    let payments = Payments::new();
    payments.gateway.script(&[Next::Decline]);
    let declined = payments.charge(&order("o-3"), "4000-0002").await;
    assert!(matches!(declined, Err(PayError::Declined)), "{declined:?}");
    assert_eq!(
        payments.gateway.requests.load(Ordering::SeqCst),
        1,
        "not retried"
    );
    assert_eq!(
        payments.samekey.stats().released,
        1,
        "the claim was given back"
    );

    let paid = payments.charge(&order("o-3"), "4242").await.unwrap();
    assert_eq!(paid, ChargeId("ch_o-3".into()));
    assert_eq!(payments.gateway.charges_for("o-3"), 1);
    assert_eq!(*payments.gateway.declined.lock().unwrap(), ["4000-0002"]);
    // Paid now: a third attempt is a replay, whatever card it brings.
    let again = payments.charge(&order("o-3"), "5555").await.unwrap();
    assert_eq!(again, paid);
    assert_eq!(payments.gateway.charges_for("o-3"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_that_stands_is_replayed_by_its_message_for_an_error_without_serde() {
    let payments = Payments::new();
    payments.gateway.script(&[Next::Refuse]);
    let first = payments.charge(&order("o-4"), "4242").await;
    let Err(PayError::Refused(e)) = &first else {
        panic!("{first:?}");
    };
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);

    let (second, report) = observed(payments.charge(&order("o-4"), "4242")).await;
    let report = report.unwrap();
    assert!(report.replayed());
    match second {
        Err(PayError::Samekey(Error::Failed { call_id, message })) => {
            assert_eq!(&call_id, report.call_id());
            assert_eq!(
                message,
                "payment refused by the gateway: merchant account suspended"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(payments.gateway.requests.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_lost_reply_is_looked_up_with_the_gateways_own_status_and_not_charged_twice() {
    let payments = Payments::new();
    payments.gateway.script(&[Next::LoseReply]);
    let (charged, report) = observed(payments.charge(&order("o-5"), "4242")).await;
    assert_eq!(charged.unwrap(), ChargeId("ch_o-5".into()));
    assert_eq!(report.unwrap().answer(), CallAnswer::Executed);
    assert_eq!(payments.gateway.requests.load(Ordering::SeqCst), 1);
    assert_eq!(payments.gateway.charges_for("o-5"), 1);
    assert_eq!(payments.samekey.stats().lookups, 1);
}

#[tokio::test(start_paused = true)]
async fn a_charge_still_processing_is_asked_again_until_it_settles() {
    let payments = Payments::new();
    payments.gateway.script(&[Next::Accept]);
    let charged = payments.charge(&order("o-12"), "4242").await;
    assert_eq!(charged.unwrap(), ChargeId("ch_o-12".into()));
    assert_eq!(
        payments.gateway.requests.load(Ordering::SeqCst),
        1,
        "never re-sent"
    );
    assert_eq!(payments.samekey.stats().lookups, 2, "pending, then charged");
}

#[tokio::test(start_paused = true)]
async fn an_unavailable_gateway_is_retried_under_one_call_id() {
    let payments = Payments::new();
    payments
        .gateway
        .script(&[Next::Unavailable, Next::Unavailable, Next::Ok]);
    let (charged, report) = observed(payments.charge(&order("o-6"), "4242")).await;
    assert!(charged.is_ok());
    assert_eq!(report.unwrap().attempts(), 3);
    assert_eq!(payments.gateway.charges_for("o-6"), 1);
}

#[tokio::test(start_paused = true)]
async fn concurrent_duplicates_charge_once() {
    let payments = Arc::new(Payments::new());
    let calls = (0..8).map(|_| {
        let payments = payments.clone();
        tokio::spawn(async move { payments.charge(&order("o-7"), "4242").await })
    });
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap().unwrap());
    }
    assert!(answers.iter().all(|a| *a == answers[0]));
    assert_eq!(payments.gateway.charges_for("o-7"), 1);
    assert_eq!(payments.gateway.requests.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_missing_request_id_runs_nothing_unless_the_function_opts_in() {
    let payments = Payments::new();
    let (refused, report) = observed(payments.refund(None, 500)).await;
    match refused {
        Err(PayError::Samekey(Error::MissingKey { part })) => assert_eq!(part, "request_id"),
        other => panic!("{other:?}"),
    }
    assert_eq!(report.unwrap().answer(), CallAnswer::Refused);
    assert_eq!(payments.samekey.stats().claims, 0, "nothing was claimed");
    // Two requests without an id are not duplicates of each other.
    assert!(payments.refund(None, 700).await.is_err());
    // With an id, the call is protected as usual.
    assert_eq!(payments.refund(Some("r-1".into()), 500).await.unwrap(), 500);
    assert_eq!(payments.refund(Some("r-1".into()), 900).await.unwrap(), 500);

    let (first, report) = observed(payments.note(None, 1)).await;
    assert_eq!(first.unwrap(), 1);
    assert_eq!(report.unwrap().answer(), CallAnswer::Unprotected);
    assert_eq!(
        payments.note(None, 2).await.unwrap(),
        2,
        "not a replay of the first"
    );
    assert_eq!(payments.note(Some("n-1".into()), 3).await.unwrap(), 3);
    assert_eq!(
        payments.samekey.stats().claims,
        2,
        "only the calls with an id claimed"
    );
}

#[tokio::test(start_paused = true)]
async fn a_missing_key_inside_another_call_does_not_give_the_outer_key_back() {
    let payments = Payments::new();
    let first = payments.cancel(&order("o-14"), None).await;
    assert!(
        matches!(first, Err(PayError::Samekey(Error::MissingKey { .. }))),
        "{first:?}"
    );
    // The outer body acted before the inner call refused: its failure stands for its key.
    let again = payments.cancel(&order("o-14"), None).await;
    assert!(
        matches!(again, Err(PayError::Samekey(Error::Failed { .. }))),
        "{again:?}"
    );
    assert_eq!(
        payments.gateway.requests.load(Ordering::SeqCst),
        1,
        "acted once"
    );
}

// ---------------------------------------------------------------------------------------------
// Two providers with a method of one name, and a free function on the default runtime.

struct Stripe;
struct Adyen;

#[samekey::scoped]
impl Stripe {
    #[idempotent(key = "order.id")]
    async fn capture(&self, order: &Order) -> Result<String, PayError> {
        Ok(format!("stripe:{}", order.id))
    }
}

#[samekey::scoped]
impl Adyen {
    #[idempotent(key = "order.id")]
    async fn capture(&self, order: &Order) -> Result<String, PayError> {
        Ok(format!("adyen:{}", order.id))
    }
}

static RECEIPTS_SENT: AtomicU32 = AtomicU32::new(0);

#[idempotent(key = "order_id")]
async fn send_receipt(order_id: &str) -> Result<u32, PayError> {
    Ok(RECEIPTS_SENT.fetch_add(1, Ordering::SeqCst) + 1)
}

#[tokio::test]
async fn two_providers_keep_their_own_keys_and_each_test_gets_a_fresh_store() {
    let rt = Runtime::builder().node("test").build().unwrap();
    rt.scope(async {
        let o = order("o-8");
        assert_eq!(Stripe.capture(&o).await.unwrap(), "stripe:o-8");
        assert_eq!(Adyen.capture(&o).await.unwrap(), "adyen:o-8");
        assert_eq!(Stripe.capture(&o).await.unwrap(), "stripe:o-8");
    })
    .await;
    assert_eq!(rt.stats().calls, 3);
    assert_eq!(rt.stats().replays, 1);

    // `send_receipt` uses the default runtime; `Runtime::scope` gives each test a store of its own,
    // so the same order is a first call in both.
    let first = Runtime::builder().node("test").build().unwrap();
    let second = Runtime::builder().node("test").build().unwrap();
    let a = first.scope(send_receipt("o-9")).await.unwrap();
    let a_again = first.scope(send_receipt("o-9")).await.unwrap();
    let b = second.scope(send_receipt("o-9")).await.unwrap();
    assert_eq!(a, a_again, "a replay in the first store");
    assert_ne!(a, b, "a first call in the second store");
    assert_eq!(first.stats().replays, 1);
    assert_eq!(second.stats().replays, 0);
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_restart_on_sqlite_replays_instead_of_charging() {
    let dir = std::env::temp_dir().join(format!(
        "samekey-first-hour-{}-{}",
        std::process::id(),
        RECEIPTS_SENT.load(Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("payments.db");
    let _ = std::fs::remove_file(&path);
    let gateway = Arc::new(Gateway::default());
    for _ in 0..2 {
        // A process start: a new runtime on the same file.
        let store = samekey::store::SqliteStore::open(&path).await.unwrap();
        let payments = Payments {
            gateway: gateway.clone(),
            samekey: Runtime::builder()
                .store(store)
                .node("api-7")
                .build()
                .unwrap(),
        };
        let charged = payments.charge(&order("o-10"), "4242").await.unwrap();
        assert_eq!(charged, ChargeId("ch_o-10".into()));
    }
    assert_eq!(gateway.requests.load(Ordering::SeqCst), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[cfg(feature = "json")]
#[tokio::test]
async fn an_untyped_json_payload_is_a_key_part_and_a_float_in_it_is_refused() {
    #[idempotent(key = "payload", scope = "webhooks.handle")]
    async fn handle(payload: &serde_json::Value) -> Result<u32, PayError> {
        Ok(RECEIPTS_SENT.fetch_add(1, Ordering::SeqCst))
    }
    #[idempotent(key = "id", verify = "payload", scope = "webhooks.verified")]
    async fn verified(id: &str, payload: &serde_json::Value) -> Result<u32, PayError> {
        Ok(RECEIPTS_SENT.fetch_add(1, Ordering::SeqCst))
    }
    let rt = Runtime::builder().node("test").build().unwrap();
    rt.scope(async {
        let a = serde_json::json!({"order": "o-11", "cents": 1250, "tags": ["a", "b"]});
        let b: serde_json::Value =
            serde_json::from_str(r#"{"tags": ["a", "b"], "cents": 1250, "order": "o-11"}"#)
                .unwrap();
        let first = handle(&a).await.unwrap();
        assert_eq!(
            handle(&b).await.unwrap(),
            first,
            "key order does not matter"
        );
        let float = serde_json::json!({"order": "o-11", "amount": 12.5});
        match handle(&float).await {
            Err(PayError::Samekey(Error::InvalidKey { part, reason })) => {
                assert_eq!(part, "payload");
                assert!(reason.contains("not an integer"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        // In `verify` too: two requests differing only by a float are not taken for one.
        match verified("w-1", &float).await {
            Err(PayError::Samekey(Error::InvalidKey { part, .. })) => assert_eq!(part, "payload"),
            other => panic!("{other:?}"),
        }
    })
    .await;
}

#[idempotent(key = "order_id", scope = "first_hour.inner")]
async fn inner_step(order_id: &str) -> Result<u32, PayError> {
    Ok(1)
}

#[idempotent(key = "order_id", scope = "first_hour.outer")]
async fn outer_step(order_id: &str) -> Result<u32, PayError> {
    Ok(inner_step(order_id).await? + 1)
}

#[tokio::test]
async fn observed_reports_the_outermost_call_not_the_ones_inside_it() {
    let rt = Runtime::builder().node("test").build().unwrap();
    let (out, report) = rt.scope(observed(outer_step("o-13"))).await;
    assert_eq!(out.unwrap(), 2);
    let report = report.unwrap();
    assert_eq!(report.key().scope(), "first_hour.outer");
    assert_eq!(report.answer(), CallAnswer::Executed);
    // Nothing to report without an #[idempotent] call.
    let ((), none) = observed(async {}).await;
    assert!(none.is_none());
}
