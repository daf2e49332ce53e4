//! Two services over real gRPC on loopback: an order service that charges through a payment service,
//! both tonic servers behind samekey's layers, the order service calling out through the client layer.
//! The payment service loses requests, loses replies after charging, answers slowly, fails with
//! `UNAVAILABLE` and with `RESOURCE_EXHAUSTED` and a pushback (seeded); customers double-submit and give
//! up mid-call (then retry with the same key and traceId). The table counts what reached the payment
//! ledger, and checks that each order's charges carried one callId and the order's traceId.
//!
//! ```text
//! cargo run -p samekey-grpc --example two_services           # seed 7
//! cargo run -p samekey-grpc --example two_services -- 42     # another seed
//! ```

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use samekey::{idempotent, Runtime, TraceId};
use samekey_grpc::metadata::{IDEMPOTENCY_KEY, RETRY_PUSHBACK_MS, X_CALL_ID, X_TRACE_ID};
use samekey_grpc::proto::receipts_client::ReceiptsClient;
use samekey_grpc::{
    lookup_receipt, receipts, CallContextLayer, CallMetadata, CallMetadataLayer, IdempotencyLayer,
};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

#[path = "proto/mod.rs"]
mod proto;

use proto::orders_client::OrdersClient;
use proto::orders_server::{Orders, OrdersServer};
use proto::payments_client::PaymentsClient;
use proto::payments_server::{Payments, PaymentsServer};
use proto::{ChargeReply, ChargeRequest, GetChargeRequest, PayRequest};

/// How long the order service waits for the payment service before the outcome is unknown.
const PAYMENT_TIMEOUT: Duration = Duration::from_millis(250);
/// How long a customer waits for the order service before giving up (and retrying).
const CUSTOMER_TIMEOUT: Duration = Duration::from_millis(400);

/// A charge as the order service keeps it (samekey stores it with serde).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Charge {
    charge_id: u64,
    order_id: u64,
    amount_cents: u64,
}

impl From<ChargeReply> for Charge {
    fn from(reply: ChargeReply) -> Charge {
        Charge {
            charge_id: reply.charge_id,
            order_id: reply.order_id,
            amount_cents: reply.amount_cents,
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// The payment service.

/// The payment service's bad days, as injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// The request is lost on its way: nothing runs, the client hears nothing.
    RequestLost,
    /// The charge happens; its reply is lost.
    ReplyLost,
    /// The charge happens after the client gave up waiting.
    SlowReply,
    /// `UNAVAILABLE` before anything ran.
    Unavailable,
    /// `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms`, before anything ran.
    ResourceExhausted,
}

impl Fault {
    /// Every kind.
    pub const ALL: [Fault; 5] = [
        Fault::RequestLost,
        Fault::ReplyLost,
        Fault::SlowReply,
        Fault::Unavailable,
        Fault::ResourceExhausted,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::RequestLost => "requests lost",
            Fault::ReplyLost => "replies lost after the charge",
            Fault::SlowReply => "slow replies",
            Fault::Unavailable => "UNAVAILABLE before processing",
            Fault::ResourceExhausted => "RESOURCE_EXHAUSTED + pushback",
        }
    }
}

/// What the payment side did: charges per order, and the callIds and traceIds each order's calls
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

struct Pay(Arc<Ledger>);

#[tonic::async_trait]
impl Payments for Pay {
    async fn charge(
        &self,
        request: Request<ChargeRequest>,
    ) -> Result<Response<ChargeReply>, Status> {
        let ledger = &self.0;
        let order_id = request.get_ref().order_id;
        for (entry, seen) in [
            (X_CALL_ID, &ledger.call_ids),
            (X_TRACE_ID, &ledger.trace_ids),
        ] {
            if let Some(id) = request.metadata().get(entry).and_then(|v| v.to_str().ok()) {
                seen.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(order_id)
                    .or_default()
                    .insert(id.to_owned());
            }
        }
        *ledger
            .charges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(order_id)
            .or_default() += 1;
        Ok(Response::new(ChargeReply {
            charge_id: ledger.next.fetch_add(1, Ordering::SeqCst) + 1,
            order_id,
            amount_cents: request.get_ref().amount_cents,
        }))
    }

    async fn get_charge(
        &self,
        _: Request<GetChargeRequest>,
    ) -> Result<Response<ChargeReply>, Status> {
        Err(Status::unimplemented("not in this example"))
    }

    type WatchStream = tokio_stream::Empty<Result<ChargeReply, Status>>;

    async fn watch(
        &self,
        _: Request<GetChargeRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("not in this example"))
    }
}

/// The network and the payment service's bad days, in front of everything else (receipt lookups pass).
#[derive(Clone)]
struct Faults<S> {
    inner: S,
    ledger: Arc<Ledger>,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for Faults<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let ledger = self.ledger.clone();
        if !request.uri().path().ends_with("/Charge") {
            return Box::pin(inner.call(request));
        }
        Box::pin(async move {
            match ledger.roll() {
                0..=7 => {
                    ledger.count(Fault::RequestLost);
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    Ok(Status::unavailable("lost").into_http())
                }
                8..=15 => {
                    ledger.count(Fault::ReplyLost);
                    let _ = inner.call(request).await;
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    Ok(Status::unavailable("reply lost").into_http())
                }
                16..=21 => {
                    ledger.count(Fault::SlowReply);
                    tokio::time::sleep(PAYMENT_TIMEOUT * 2).await;
                    inner.call(request).await
                }
                22..=27 => {
                    ledger.count(Fault::Unavailable);
                    Ok(Status::unavailable("overloaded, nothing ran").into_http())
                }
                28..=33 => {
                    ledger.count(Fault::ResourceExhausted);
                    let mut status = Status::resource_exhausted("quota, nothing ran");
                    if let Ok(value) = "20".parse() {
                        status.metadata_mut().insert(RETRY_PUSHBACK_MS, value);
                    }
                    Ok(status.into_http())
                }
                _ => inner.call(request).await,
            }
        })
    }
}

async fn listen() -> (tokio::net::TcpListener, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("its address");
    (listener, addr)
}

async fn payment_service(ledger: Arc<Ledger>) -> SocketAddr {
    let rt = Runtime::builder()
        .node("payments-1")
        .build()
        .expect("runtime");
    let (listener, addr) = listen().await;
    let faults = ledger.clone();
    let router = Server::builder()
        .layer(tower::layer::layer_fn(move |inner| Faults {
            inner,
            ledger: faults.clone(),
        }))
        .layer(CallContextLayer::new())
        .layer(IdempotencyLayer::new().runtime(&rt))
        .add_service(PaymentsServer::new(Pay(ledger)))
        .add_service(receipts(&rt));
    tokio::spawn(
        router.serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    addr
}

fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("a loopback address")
        .connect_lazy()
}

// ---------------------------------------------------------------------------------------------------
// The order service.

struct Shop {
    rt: Runtime,
    payments: PaymentsClient<CallMetadata<Channel>>,
    receipts: ReceiptsClient<Channel>,
}

impl Shop {
    /// One charge per order: the callId goes out as `x-call-id` and `idempotency-key` on every
    /// attempt; a timeout asks the payment service's receipt service before anything is sent again.
    #[idempotent(key = "order_id", scope = "orders.pay", runtime = &self.rt, timeout = "250ms",
                 retries = 4, backoff = "20ms..200ms",
                 lookup = |call| lookup_receipt::<ChargeReply, _, _>(self.receipts.clone(), call))]
    async fn pay(&self, order_id: u64, amount_cents: u64) -> Result<Charge, Status> {
        let request = ChargeRequest {
            order_id,
            amount_cents,
        };
        Ok(self
            .payments
            .clone()
            .charge(request)
            .await?
            .into_inner()
            .into())
    }
}

#[tonic::async_trait]
impl Orders for Shop {
    async fn pay(&self, request: Request<PayRequest>) -> Result<Response<ChargeReply>, Status> {
        let order_id = request.get_ref().order_id;
        match Shop::pay(self, order_id, 1_000 + order_id).await {
            Ok(charge) => Ok(Response::new(ChargeReply {
                charge_id: charge.charge_id,
                order_id: charge.order_id,
                amount_cents: charge.amount_cents,
            })),
            // Not stored by the order service's layer (`UNAVAILABLE` gives the key back): the
            // customer may retry, and `pay` answers from its own receipt.
            Err(e) => Err(Status::unavailable(format!(
                "payment not settled yet: {}",
                e.message()
            ))),
        }
    }
}

async fn order_service(payments: SocketAddr) -> SocketAddr {
    let rt = Runtime::builder()
        .node("orders-1")
        .build()
        .expect("runtime");
    let shop = Shop {
        rt: rt.clone(),
        payments: PaymentsClient::new(
            tower::ServiceBuilder::new()
                .layer(CallMetadataLayer::new())
                .service(channel(payments)),
        ),
        receipts: ReceiptsClient::new(channel(payments)),
    };
    let (listener, addr) = listen().await;
    let router = Server::builder()
        .layer(CallContextLayer::new())
        .layer(IdempotencyLayer::new().runtime(&rt))
        .add_service(OrdersServer::new(shop));
    tokio::spawn(
        router.serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    addr
}

// ---------------------------------------------------------------------------------------------------
// The customers and the report.

/// What a run did.
#[derive(Debug, Default)]
pub struct Report {
    /// Orders paid for.
    pub orders: u64,
    /// Calls customers made to the order service (double submissions and retries included).
    pub customer_calls: u64,
    /// Customer calls that gave up before the answer (then retried).
    pub disconnects: u64,
    /// Charges the payment ledger holds.
    pub charges: u64,
    /// Orders charged more than once.
    pub charged_twice: u64,
    /// Orders whose charge calls carried more than one callId.
    pub several_call_ids: u64,
    /// Orders charged whose charge calls did not all carry the order's traceId.
    pub other_trace_ids: u64,
    /// Orders a customer was told were paid.
    pub paid: u64,
    /// Customers told "paid" for an order the ledger did not charge.
    pub paid_but_not_charged: u64,
    /// The payment service's faults, by kind (every kind, in [`Fault::ALL`]'s order).
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

/// A customer paying for an order: the same `idempotency-key` and traceId on every try, giving up
/// after a while (its deadline) and trying again, up to 8 times.
async fn customer(
    client: OrdersClient<Channel>,
    order_id: u64,
    trace_id: TraceId,
    stats: Arc<Mutex<Report>>,
) -> bool {
    for _ in 0..8 {
        stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .customer_calls += 1;
        let mut request = Request::new(PayRequest { order_id });
        let metadata = request.metadata_mut();
        if let (Ok(key), Ok(trace)) = (
            format!("pay-order-{order_id}").parse(),
            trace_id.to_string().parse(),
        ) {
            metadata.insert(IDEMPOTENCY_KEY, key);
            metadata.insert(X_TRACE_ID, trace);
        }
        request.set_timeout(CUSTOMER_TIMEOUT);
        match client.clone().pay(request).await {
            Ok(_) => return true,
            Err(status)
                if status.code() == tonic::Code::Cancelled
                    || status.code() == tonic::Code::DeadlineExceeded =>
            {
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
    let payments = payment_service(ledger.clone()).await;
    let order_service = order_service(payments).await;
    let stats = Arc::new(Mutex::new(Report {
        orders,
        ..Report::default()
    }));
    let client = OrdersClient::new(channel(order_service));
    let mut customers = tokio::task::JoinSet::new();
    let mut trace_ids = HashMap::new();
    for order_id in 1..=orders {
        let trace_id = TraceId::new();
        trace_ids.insert(order_id, trace_id.to_string());
        let submissions = if order_id % 5 == 0 { 2 } else { 1 };
        for _ in 0..submissions {
            let (client, stats) = (client.clone(), stats.clone());
            customers.spawn(async move {
                let paid = customer(client, order_id, trace_id, stats).await;
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
    // Let the charges the customers gave up on land (the methods run to their end).
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
    println!(
        "two_services — an order service charging through a payment service over gRPC, seed {seed}"
    );
    for (fault, n) in &report.faults {
        println!("  payment service fault: {:<32} {n}", fault.name());
    }
    println!();
    let rows = [
        ("orders", report.orders),
        ("customer calls (retries included)", report.customer_calls),
        ("customers who gave up mid-call", report.disconnects),
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
