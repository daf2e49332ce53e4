//! Two services over real HTTP on loopback: an order API that charges through a payment API, both axum
//! behind samekey's layers, the order API calling out through the reqwest middleware. The payment API
//! loses requests, loses replies after charging, answers slowly, fails with 502 and rate-limits
//! (seeded); customers double-submit and give up mid-request (then retry with the same key and
//! traceId). The table counts what reached the payment ledger, and checks that each order's charges
//! carried one callId and the order's traceId.
//!
//! ```text
//! cargo run -p samekey-http --example two_services --features axum,reqwest           # seed 7
//! cargo run -p samekey-http --example two_services --features axum,reqwest -- 42     # another seed
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use reqwest_middleware::ClientWithMiddleware;
use samekey::{idempotent, Runtime, TraceId};
use samekey_http::{
    lookup_receipt, receipts, send, CallContextLayer, CallHeaders, IdempotencyLayer, RemoteError,
};
use serde::{Deserialize, Serialize};

/// How long the order API waits for the payment API before the outcome is unknown.
const PAYMENT_TIMEOUT: Duration = Duration::from_millis(250);
/// How long a customer waits for the order API before giving up (and retrying).
const CUSTOMER_TIMEOUT: Duration = Duration::from_millis(400);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChargeRequest {
    order_id: u64,
    amount_cents: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Charge {
    charge_id: u64,
    order_id: u64,
    amount_cents: u64,
}

// ---------------------------------------------------------------------------------------------------
// The payment API.

/// The payment API's bad days, as injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// The request is lost on its way: nothing runs, the client hears nothing.
    RequestLost,
    /// The charge happens; its reply is lost.
    ReplyLost,
    /// The charge happens after the client gave up waiting.
    SlowReply,
    /// A 502 before anything ran.
    BadGateway,
    /// A 429 before anything ran.
    RateLimited,
}

impl Fault {
    /// Every kind.
    pub const ALL: [Fault; 5] = [
        Fault::RequestLost,
        Fault::ReplyLost,
        Fault::SlowReply,
        Fault::BadGateway,
        Fault::RateLimited,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::RequestLost => "requests lost",
            Fault::ReplyLost => "replies lost after the charge",
            Fault::SlowReply => "slow replies",
            Fault::BadGateway => "502 before processing",
            Fault::RateLimited => "429 rate limited",
        }
    }
}

/// What the payment side did: charges per order, and the callIds and traceIds each order's requests
/// carried.
#[derive(Default)]
struct Ledger {
    charges: Mutex<HashMap<u64, u32>>,
    call_ids: Mutex<HashMap<u64, HashSet<String>>>,
    trace_ids: Mutex<HashMap<u64, HashSet<String>>>,
    next: AtomicU64,
    rng: Mutex<u64>,
    faults: Mutex<HashMap<Fault, u64>>,
}

impl Ledger {
    fn roll(&self) -> u64 {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        *rng = rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % 100
    }

    fn count(&self, fault: Fault) {
        *self
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(fault)
            .or_default() += 1;
    }
}

async fn charge(
    State(ledger): State<Arc<Ledger>>,
    headers: HeaderMap,
    Json(request): Json<ChargeRequest>,
) -> Json<Charge> {
    for (header, seen) in [
        ("x-call-id", &ledger.call_ids),
        ("x-trace-id", &ledger.trace_ids),
    ] {
        if let Some(id) = headers.get(header).and_then(|v| v.to_str().ok()) {
            seen.lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(request.order_id)
                .or_default()
                .insert(id.to_owned());
        }
    }
    *ledger
        .charges
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(request.order_id)
        .or_default() += 1;
    Json(Charge {
        charge_id: ledger.next.fetch_add(1, Ordering::SeqCst) + 1,
        order_id: request.order_id,
        amount_cents: request.amount_cents,
    })
}

/// The network and the payment API's bad days, in front of everything else (receipt lookups pass).
async fn faults(State(ledger): State<Arc<Ledger>>, request: Request, next: Next) -> Response {
    if request.uri().path().starts_with("/receipts") {
        return next.run(request).await;
    }
    match ledger.roll() {
        0..=7 => {
            // The request is lost on its way: nothing runs, the client hears nothing.
            ledger.count(Fault::RequestLost);
            tokio::time::sleep(Duration::from_secs(3)).await;
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
        8..=15 => {
            // The charge happens; its reply is lost.
            ledger.count(Fault::ReplyLost);
            let _ = next.run(request).await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
        16..=21 => {
            // Slow: the charge happens after the client gave up.
            ledger.count(Fault::SlowReply);
            tokio::time::sleep(PAYMENT_TIMEOUT * 2).await;
            next.run(request).await
        }
        22..=27 => {
            ledger.count(Fault::BadGateway);
            StatusCode::BAD_GATEWAY.into_response()
        }
        28..=32 => {
            ledger.count(Fault::RateLimited);
            (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "0")]).into_response()
        }
        _ => next.run(request).await,
    }
}

async fn payment_api(ledger: Arc<Ledger>) -> String {
    let rt = Runtime::builder()
        .node("payments-1")
        .build()
        .expect("runtime");
    let app = Router::new()
        .route("/charges", post(charge))
        .with_state(ledger.clone())
        .layer(IdempotencyLayer::new().runtime(&rt))
        .layer(CallContextLayer::new())
        .merge(receipts(&rt))
        .layer(middleware::from_fn_with_state(ledger, faults));
    listen(app).await
}

// ---------------------------------------------------------------------------------------------------
// The order API.

struct Orders {
    rt: Runtime,
    client: ClientWithMiddleware,
    payments: String,
}

impl Orders {
    /// One charge per order: the callId goes out as `X-Call-Id` and `Idempotency-Key` on every
    /// attempt; a timeout asks the payment API's receipt endpoint before anything is sent again.
    #[idempotent(key = "order_id", scope = "orders.pay", runtime = &self.rt, timeout = "250ms",
                 retries = 4, backoff = "20ms..200ms",
                 lookup = |call| lookup_receipt::<Charge>(&self.client, format!("{}/receipts/{call}", self.payments)))]
    async fn pay(&self, order_id: u64, amount_cents: u64) -> Result<Charge, RemoteError> {
        let request = self
            .client
            .post(format!("{}/charges", self.payments))
            .json(&ChargeRequest {
                order_id,
                amount_cents,
            });
        Ok(send(request).await?.json().await?)
    }
}

async fn pay_order(State(orders): State<Arc<Orders>>, Path(order_id): Path<u64>) -> Response {
    match orders.pay(order_id, 1_000 + order_id).await {
        Ok(charge) => Json(charge).into_response(),
        // Not stored by the order API's Idempotency-Key layer (5xx): the customer may retry.
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}

async fn order_api(payments: String) -> String {
    let rt = Runtime::builder()
        .node("orders-1")
        .build()
        .expect("runtime");
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(CallHeaders::new())
        .build();
    let orders = Arc::new(Orders {
        rt: rt.clone(),
        client,
        payments,
    });
    let app = Router::new()
        .route("/orders/{id}/pay", post(pay_order))
        .with_state(orders)
        .layer(IdempotencyLayer::new().runtime(&rt))
        .layer(CallContextLayer::new());
    listen(app).await
}

async fn listen(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let base = format!("http://{}", listener.local_addr().expect("its address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

// ---------------------------------------------------------------------------------------------------
// The customers and the report.

/// What a run did.
#[derive(Debug, Default)]
pub struct Report {
    /// Orders paid for.
    pub orders: u64,
    /// Requests customers sent to the order API (double submissions and retries included).
    pub customer_requests: u64,
    /// Customer requests that gave up before the answer (then retried).
    pub disconnects: u64,
    /// Charges the payment ledger holds.
    pub charges: u64,
    /// Orders charged more than once.
    pub charged_twice: u64,
    /// Orders whose charge requests carried more than one callId.
    pub several_call_ids: u64,
    /// Orders charged whose charge requests did not all carry the order's traceId.
    pub other_trace_ids: u64,
    /// Orders a customer was told were paid.
    pub paid: u64,
    /// Customers told "paid" for an order the ledger did not charge.
    pub paid_but_not_charged: u64,
    /// The payment API's faults, by kind (every kind, in [`Fault::ALL`]'s order).
    pub faults: Vec<(Fault, u64)>,
}

impl Report {
    /// How many faults of `kind` were injected.
    pub fn faults_of(&self, kind: Fault) -> u64 {
        self.faults
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(0, |(_, n)| *n)
    }
}

/// A customer paying for an order: the same Idempotency-Key and traceId on every try, giving up after
/// a while and trying again, up to 8 times.
async fn customer(
    client: reqwest::Client,
    orders: String,
    order_id: u64,
    trace_id: TraceId,
    stats: Arc<Mutex<Report>>,
) -> bool {
    let key = format!("\"pay-order-{order_id}\"");
    for _ in 0..8 {
        stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .customer_requests += 1;
        let sent = client
            .post(format!("{orders}/orders/{order_id}/pay"))
            .header("idempotency-key", &key)
            .header("x-trace-id", trace_id.to_string())
            .timeout(CUSTOMER_TIMEOUT)
            .send()
            .await;
        match sent {
            Ok(response) if response.status().is_success() => return true,
            Ok(_) => {}
            Err(e) if e.is_timeout() => {
                stats.lock().unwrap_or_else(|p| p.into_inner()).disconnects += 1;
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    false
}

/// Runs `orders` orders (every 5th submitted twice at once, each order under a traceId of its own)
/// against the two services.
pub async fn scenario(seed: u64, orders: u64) -> Report {
    let ledger = Arc::new(Ledger::default());
    *ledger.rng.lock().unwrap_or_else(|p| p.into_inner()) = seed;
    let payments = payment_api(ledger.clone()).await;
    let order_api = order_api(payments).await;
    let stats = Arc::new(Mutex::new(Report {
        orders,
        ..Report::default()
    }));
    let client = reqwest::Client::new();
    let mut customers = tokio::task::JoinSet::new();
    let mut trace_ids = HashMap::new();
    for order_id in 1..=orders {
        let trace_id = TraceId::new();
        trace_ids.insert(order_id, trace_id.to_string());
        let submissions = if order_id % 5 == 0 { 2 } else { 1 };
        for _ in 0..submissions {
            let (client, base, stats) = (client.clone(), order_api.clone(), stats.clone());
            customers.spawn(async move {
                let paid = customer(client, base, order_id, trace_id, stats).await;
                (order_id, paid)
            });
        }
    }
    let mut paid = HashSet::new();
    while let Some(done) = customers.join_next().await {
        if let Ok((order_id, true)) = done {
            paid.insert(order_id);
        }
    }
    // Let the charges the customers gave up on land (their handlers run to the end).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut report = Arc::try_unwrap(stats)
        .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()))
        .unwrap_or_default();
    let charges = ledger.charges.lock().unwrap_or_else(|p| p.into_inner());
    report.charges = charges.values().map(|&n| u64::from(n)).sum();
    report.charged_twice = charges.values().filter(|&&n| n > 1).count() as u64;
    report.paid = paid.len() as u64;
    report.paid_but_not_charged = paid.iter().filter(|id| !charges.contains_key(id)).count() as u64;
    report.several_call_ids = ledger
        .call_ids
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .filter(|ids| ids.len() > 1)
        .count() as u64;
    let seen_trace_ids = ledger.trace_ids.lock().unwrap_or_else(|p| p.into_inner());
    report.other_trace_ids = charges
        .keys()
        .filter(|order_id| {
            let seen = seen_trace_ids.get(order_id);
            let expected = trace_ids.get(order_id);
            // Exactly the order's traceId, on every charge request that arrived.
            !seen.is_some_and(|seen| seen.len() == 1 && expected.is_some_and(|t| seen.contains(t)))
        })
        .count() as u64;
    let faults = ledger.faults.lock().unwrap_or_else(|p| p.into_inner());
    report.faults = Fault::ALL
        .iter()
        .map(|kind| (*kind, faults.get(kind).copied().unwrap_or(0)))
        .collect();
    report
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seed = match std::env::args().nth(1) {
        Some(arg) => arg
            .parse()
            .map_err(|e| format!("the seed must be a number, got {arg:?}: {e}"))?,
        None => 7,
    };
    let started = std::time::Instant::now();
    let report = scenario(seed, 60).await;
    println!("two_services — an order API charging through a payment API over HTTP, seed {seed}");
    for (fault, n) in &report.faults {
        println!("  payment API fault: {:<32} {n}", fault.name());
    }
    println!();
    let rows = [
        ("orders", report.orders),
        (
            "customer requests (retries included)",
            report.customer_requests,
        ),
        ("customers who gave up mid-request", report.disconnects),
        ("orders paid", report.paid),
        ("charges in the payment ledger", report.charges),
        ("orders charged twice", report.charged_twice),
        (
            "orders whose charges carried 2+ callIds",
            report.several_call_ids,
        ),
        (
            "orders whose charges carried another traceId",
            report.other_trace_ids,
        ),
        ("told paid, but not charged", report.paid_but_not_charged),
    ];
    for (name, value) in rows {
        println!("{name:<44}{value:>8}");
    }
    println!("\ntook {:.1} s", started.elapsed().as_secs_f64());
    if report.charged_twice != 0
        || report.several_call_ids != 0
        || report.other_trace_ids != 0
        || report.paid_but_not_charged != 0
    {
        return Err(
            "a duplicate charge, a second callId or another traceId, or a false \"paid\"".into(),
        );
    }
    Ok(())
}
