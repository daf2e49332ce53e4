//! samekey-grpc over real gRPC on loopback: tonic servers behind the layers, tonic clients through the
//! client layer.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use samekey::{idempotent, Classify, ErrorClass, RemoteStatus, Runtime, Store};
use samekey_grpc::metadata::{
    GRPC_PREVIOUS_RPC_ATTEMPTS, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, RETRY_PUSHBACK_MS, X_CALL_ID,
    X_CALL_ID_SOURCE, X_TRACE_ID,
};
use samekey_grpc::{
    lookup_receipt, receipts, CallContextLayer, CallIds, CallMetadataLayer, IdempotencyLayer,
    IdempotencyLevel,
};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status};

#[path = "../examples/proto/mod.rs"]
mod proto;

use proto::payments_client::PaymentsClient;
use proto::payments_server::{Payments, PaymentsServer};
use proto::{ChargeReply, ChargeRequest, GetChargeRequest};

/// What one method call saw.
#[derive(Debug, Clone)]
struct Seen {
    call_id: Option<String>,
    trace_id: Option<String>,
    key: Option<String>,
    previous_attempts: Option<String>,
    traceparent: Option<String>,
    ids: Option<CallIds>,
}

/// A payment service: charges count; an order id of 900+c fails with code c; `slow` sleeps first.
#[derive(Default)]
struct Ledger {
    charges: AtomicU64,
    seen: Mutex<Vec<Seen>>,
    slow: Mutex<Option<Duration>>,
}

struct Pay(Arc<Ledger>);

fn seen<T>(request: &Request<T>) -> Seen {
    let get = |name: &str| {
        request
            .metadata()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    Seen {
        call_id: get(X_CALL_ID),
        trace_id: get(X_TRACE_ID),
        key: get(IDEMPOTENCY_KEY),
        previous_attempts: get(GRPC_PREVIOUS_RPC_ATTEMPTS),
        traceparent: get("traceparent"),
        ids: request.extensions().get::<CallIds>().cloned(),
    }
}

#[tonic::async_trait]
impl Payments for Pay {
    async fn charge(
        &self,
        request: Request<ChargeRequest>,
    ) -> Result<Response<ChargeReply>, Status> {
        self.0.seen.lock().unwrap().push(seen(&request));
        let slow = *self.0.slow.lock().unwrap();
        if let Some(slow) = slow {
            tokio::time::sleep(slow).await;
        }
        let ChargeRequest {
            order_id,
            amount_cents,
        } = request.into_inner();
        if (900..=916).contains(&order_id) {
            return Err(Status::new(Code::from((order_id - 900) as i32), "as asked"));
        }
        let charge_id = self.0.charges.fetch_add(1, Ordering::SeqCst) + 1;
        let mut response = Response::new(ChargeReply {
            charge_id,
            order_id,
            amount_cents,
        });
        response
            .metadata_mut()
            .insert("x-ledger", "main".parse().unwrap());
        Ok(response)
    }

    async fn get_charge(
        &self,
        request: Request<GetChargeRequest>,
    ) -> Result<Response<ChargeReply>, Status> {
        self.0.seen.lock().unwrap().push(seen(&request));
        Err(Status::internal("flaky read"))
    }

    type WatchStream = tokio_stream::Iter<std::vec::IntoIter<Result<ChargeReply, Status>>>;

    async fn watch(
        &self,
        _request: Request<GetChargeRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.0.charges.fetch_add(1_000, Ordering::SeqCst);
        Ok(Response::new(tokio_stream::iter(vec![
            Ok(ChargeReply::default()),
            Ok(ChargeReply::default()),
        ])))
    }
}

/// Serves the payment service (and its receipts) on loopback, behind the layers.
async fn serve(
    ledger: Arc<Ledger>,
    rt: &Runtime,
    layer: IdempotencyLayer,
    context: CallContextLayer,
) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Server::builder()
        .layer(context)
        .layer(layer)
        .add_service(PaymentsServer::new(Pay(ledger)))
        .add_service(receipts(rt));
    tokio::spawn(
        router.serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    addr
}

async fn payment_service(ledger: Arc<Ledger>) -> (SocketAddr, Runtime) {
    payment_service_on(ledger, Arc::new(samekey::MemoryStore::new())).await
}

async fn payment_service_on(ledger: Arc<Ledger>, store: Arc<dyn Store>) -> (SocketAddr, Runtime) {
    let rt = Runtime::builder()
        .node("pay-1")
        .shared_store(store)
        .build()
        .unwrap();
    let layer = IdempotencyLayer::new()
        .runtime(&rt)
        .descriptors(proto::FILE_DESCRIPTOR_SET)
        .unwrap()
        .retry_after(Duration::from_millis(50));
    let addr = serve(ledger, &rt, layer, CallContextLayer::new()).await;
    (addr, rt)
}

fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy()
}

/// `message` with the idempotency key `key`, made this run's own (the durable stores outlive a run).
fn keyed<T>(message: T, key: &str) -> Request<T> {
    static RUN: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| format!("{:x}", samekey::TraceId::new().as_u128()));
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert(IDEMPOTENCY_KEY, format!("{key}-{}", *RUN).parse().unwrap());
    request
}

fn charge(order_id: u64, amount_cents: u64) -> ChargeRequest {
    ChargeRequest {
        order_id,
        amount_cents,
    }
}

async fn a_repeated_key_is_replayed_with_its_metadata(store: Arc<dyn Store>) {
    let ledger = Arc::new(Ledger::default());
    let (addr, _rt) = payment_service_on(ledger.clone(), store).await;
    let mut client = PaymentsClient::new(channel(addr));
    let first = client.charge(keyed(charge(1, 500), "k-1")).await.unwrap();
    let again = client.charge(keyed(charge(1, 500), "k-1")).await.unwrap();
    assert_eq!(first.get_ref(), again.get_ref());
    assert_eq!(ledger.charges.load(Ordering::SeqCst), 1, "charged once");
    assert!(first.metadata().get(IDEMPOTENT_REPLAYED).is_none());
    assert_eq!(again.metadata().get(IDEMPOTENT_REPLAYED).unwrap(), "true");
    assert_eq!(
        again.metadata().get("x-ledger").unwrap(),
        "main",
        "its own metadata replayed"
    );
    // A stored failure is replayed too, with its status and message.
    let failed = client
        .charge(keyed(charge(905, 1), "k-905"))
        .await
        .unwrap_err();
    let replayed = client
        .charge(keyed(charge(905, 1), "k-905"))
        .await
        .unwrap_err();
    assert_eq!(failed.code(), Code::NotFound);
    assert_eq!(replayed.code(), Code::NotFound);
    assert_eq!(replayed.message(), "as asked");
    assert_eq!(
        replayed.metadata().get(IDEMPOTENT_REPLAYED).unwrap(),
        "true"
    );
    assert_eq!(ledger.seen.lock().unwrap().len(), 2, "each method ran once");
}

async fn the_same_key_with_another_request_is_failed_precondition(store: Arc<dyn Store>) {
    let ledger = Arc::new(Ledger::default());
    let (addr, _rt) = payment_service_on(ledger.clone(), store).await;
    let mut client = PaymentsClient::new(channel(addr));
    client.charge(keyed(charge(2, 500), "k-2")).await.unwrap();
    let refused = client
        .charge(keyed(charge(2, 999), "k-2"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("another request"), "{refused:?}");
    assert_eq!(ledger.charges.load(Ordering::SeqCst), 1);
}

async fn a_key_in_flight_is_aborted_with_retry_info(store: Arc<dyn Store>) {
    let ledger = Arc::new(Ledger::default());
    *ledger.slow.lock().unwrap() = Some(Duration::from_millis(400));
    let (addr, _rt) = payment_service_on(ledger.clone(), store).await;
    let mut first = PaymentsClient::new(channel(addr));
    let mut second = first.clone();
    let running = tokio::spawn(async move { first.charge(keyed(charge(3, 500), "k-3")).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let busy = second
        .charge(keyed(charge(3, 500), "k-3"))
        .await
        .unwrap_err();
    assert_eq!(busy.code(), Code::Aborted, "{busy:?}");
    assert_eq!(busy.metadata().get(RETRY_PUSHBACK_MS).unwrap(), "50");
    use tonic_types::StatusExt as _;
    assert_eq!(
        busy.get_details_retry_info().and_then(|r| r.retry_delay),
        Some(Duration::from_millis(50))
    );
    assert_eq!(
        busy.classify(),
        ErrorClass::RateLimited {
            retry_after: Some(Duration::from_millis(50))
        }
    );
    let reply = running.await.unwrap().unwrap();
    let after = second.charge(keyed(charge(3, 500), "k-3")).await.unwrap();
    assert_eq!(reply.get_ref(), after.get_ref());
    assert_eq!(ledger.charges.load(Ordering::SeqCst), 1);
}

/// The scenarios above on every store this build has (a durable one's server from its
/// `SAMEKEY_*_URL`, or a visible `skipped:` line).
macro_rules! on_stores {
    ($($test:ident),+ $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test(std::sync::Arc::new(samekey::MemoryStore::new())).await;
                }
            )+
        }
        #[cfg(feature = "sqlite")]
        mod sqlite {
            $(
                #[tokio::test]
                async fn $test() {
                    let dir = tempfile::tempdir().unwrap();
                    let store = samekey::store::SqliteStore::open(dir.path().join("s.db"))
                        .await
                        .unwrap();
                    super::$test(std::sync::Arc::new(store)).await;
                }
            )+
        }
        #[cfg(feature = "postgres")]
        mod postgres {
            $(
                #[tokio::test]
                async fn $test() {
                    let Ok(url) = std::env::var("SAMEKEY_PG_URL") else {
                        samekey::conformance::skipped("set SAMEKEY_PG_URL to run the layers on PostgreSQL");
                        return;
                    };
                    let store = samekey::store::PgStore::connect(&url).await.unwrap();
                    super::$test(std::sync::Arc::new(store)).await;
                }
            )+
        }
        #[cfg(feature = "mysql")]
        mod mysql {
            $(
                #[tokio::test]
                async fn $test() {
                    let Ok(url) = std::env::var("SAMEKEY_MYSQL_URL") else {
                        samekey::conformance::skipped("set SAMEKEY_MYSQL_URL to run the layers on MySQL");
                        return;
                    };
                    let store = samekey::store::MySqlStore::connect(&url).await.unwrap();
                    super::$test(std::sync::Arc::new(store)).await;
                }
            )+
        }
        #[cfg(feature = "redis")]
        mod redis {
            $(
                #[tokio::test]
                async fn $test() {
                    let Ok(url) = std::env::var("SAMEKEY_REDIS_URL") else {
                        samekey::conformance::skipped("set SAMEKEY_REDIS_URL to run the layers on Redis");
                        return;
                    };
                    let prefix = format!("samekey-grpc-{:x}", samekey::TraceId::new().as_u128());
                    let store = samekey::store::RedisStore::connect_with_prefix(&url, &prefix)
                        .await
                        .unwrap();
                    super::$test(std::sync::Arc::new(store)).await;
                }
            )+
        }
    };
}

on_stores!(
    a_repeated_key_is_replayed_with_its_metadata,
    the_same_key_with_another_request_is_failed_precondition,
    a_key_in_flight_is_aborted_with_retry_info,
);

#[tokio::test]
async fn a_streaming_method_is_refused_with_a_key() {
    let ledger = Arc::new(Ledger::default());
    let (addr, _rt) = payment_service(ledger.clone()).await;
    let mut client = PaymentsClient::new(channel(addr));
    let refused = client
        .watch(keyed(GetChargeRequest { order_id: 1 }, "k-w"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unimplemented, "{refused:?}");
    assert!(refused.message().contains("streaming"), "{refused:?}");
    assert_eq!(ledger.charges.load(Ordering::SeqCst), 0, "nothing ran");
    // Without a key it runs, unprotected.
    let mut stream = client
        .watch(GetChargeRequest { order_id: 1 })
        .await
        .unwrap()
        .into_inner();
    while stream.message().await.unwrap().is_some() {}
    assert_eq!(ledger.charges.load(Ordering::SeqCst), 1_000);
}

#[tokio::test]
async fn an_undeclared_server_stream_is_answered_once_and_refused_after() {
    let ledger = Arc::new(Ledger::default());
    let rt = Runtime::builder().node("pay-1").build().unwrap();
    // No descriptors: the layer finds the stream in the reply.
    let addr = serve(
        ledger.clone(),
        &rt,
        IdempotencyLayer::new().runtime(&rt),
        CallContextLayer::new(),
    )
    .await;
    let mut client = PaymentsClient::new(channel(addr));
    let mut stream = client
        .watch(keyed(GetChargeRequest { order_id: 1 }, "k-s"))
        .await
        .unwrap()
        .into_inner();
    let mut messages = 0;
    while stream.message().await.unwrap().is_some() {
        messages += 1;
    }
    assert_eq!(messages, 2, "the first client gets the whole stream");
    let again = client
        .watch(keyed(GetChargeRequest { order_id: 1 }, "k-s"))
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::Unimplemented, "{again:?}");
    assert_eq!(ledger.charges.load(Ordering::SeqCst), 1_000, "ran once");
}

#[tokio::test]
async fn call_context_is_adopted_validated_and_echoed_and_a_gateway_fills_it() {
    let ledger = Arc::new(Ledger::default());
    let rt = Runtime::builder().node("gw-1").build().unwrap();
    let addr = serve(
        ledger.clone(),
        &rt,
        IdempotencyLayer::new().runtime(&rt),
        CallContextLayer::gateway("gw", "edge-1"),
    )
    .await;
    let mut client = PaymentsClient::new(channel(addr));
    // Filled and marked.
    let reply = client.charge(charge(10, 1)).await.unwrap();
    assert_eq!(reply.metadata().get(X_CALL_ID_SOURCE).unwrap(), "gateway");
    let filled = reply
        .metadata()
        .get(X_CALL_ID)
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert!(filled.starts_with("gw-"), "{filled}");
    let seen = ledger.seen.lock().unwrap()[0].clone();
    assert_eq!(seen.call_id.as_deref(), Some(filled.as_str()));
    assert_eq!(
        seen.ids.unwrap().source,
        samekey_grpc::CallIdSource::Gateway
    );
    // Adopted and echoed.
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut request = Request::new(charge(11, 1));
    let call_id = samekey::CallId::new("ord", "n1").unwrap().to_string();
    request
        .metadata_mut()
        .insert(X_CALL_ID, call_id.parse().unwrap());
    request
        .metadata_mut()
        .insert(X_TRACE_ID, trace.parse().unwrap());
    let reply = client.charge(request).await.unwrap();
    assert_eq!(reply.metadata().get(X_TRACE_ID).unwrap(), trace);
    assert_eq!(reply.metadata().get(X_CALL_ID).unwrap(), call_id.as_str());
    assert!(reply.metadata().get(X_CALL_ID_SOURCE).is_none());
    let adopted = ledger.seen.lock().unwrap()[1].clone();
    assert_eq!(adopted.call_id.as_deref(), Some(call_id.as_str()));
    assert_eq!(adopted.ids.unwrap().trace_id.to_string(), trace);
    // Malformed: refused before anything runs.
    let before = ledger.seen.lock().unwrap().len();
    let mut request = Request::new(charge(12, 1));
    request
        .metadata_mut()
        .insert(X_TRACE_ID, "not-a-trace".parse().unwrap());
    let refused = client.charge(request).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("x-trace-id"), "{refused:?}");
    assert_eq!(ledger.seen.lock().unwrap().len(), before);
}

/// The class every code gets, over the wire, for a method with side effects.
#[tokio::test]
async fn every_status_is_classified_as_documented() {
    let ledger = Arc::new(Ledger::default());
    let (addr, _rt) = payment_service(ledger.clone()).await;
    let mut client = PaymentsClient::new(channel(addr));
    let expected: HashMap<Code, ErrorClass> = [
        (Code::Cancelled, ErrorClass::Unknown),
        (Code::Unknown, ErrorClass::Unknown),
        (Code::InvalidArgument, ErrorClass::Rejected),
        (Code::DeadlineExceeded, ErrorClass::Unknown),
        (Code::NotFound, ErrorClass::Rejected),
        (Code::AlreadyExists, ErrorClass::Permanent),
        (Code::PermissionDenied, ErrorClass::Rejected),
        (
            Code::ResourceExhausted,
            ErrorClass::RateLimited { retry_after: None },
        ),
        (Code::FailedPrecondition, ErrorClass::Rejected),
        (Code::Aborted, ErrorClass::Rejected),
        (Code::OutOfRange, ErrorClass::Rejected),
        (Code::Unimplemented, ErrorClass::Rejected),
        (Code::Internal, ErrorClass::Unknown),
        (Code::Unavailable, ErrorClass::Retryable),
        (Code::DataLoss, ErrorClass::Unknown),
        (Code::Unauthenticated, ErrorClass::Rejected),
    ]
    .into_iter()
    .collect();
    for (code, class) in &expected {
        let order_id = 900 + *code as u64;
        let status = client.charge(charge(order_id, 1)).await.unwrap_err();
        assert_eq!(status.code(), *code);
        assert_eq!(status.classify(), *class, "{code:?}");
    }
    // A read (NO_SIDE_EFFECTS in its .proto) may be resent after INTERNAL, through the client layer.
    let layered = tower::ServiceBuilder::new()
        .layer(
            CallMetadataLayer::new()
                .descriptors(proto::FILE_DESCRIPTOR_SET)
                .unwrap(),
        )
        .service(channel(addr));
    let mut reads = PaymentsClient::new(layered);
    let status = reads
        .get_charge(GetChargeRequest { order_id: 1 })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    assert_eq!(status.classify(), ErrorClass::Retryable);
    // And a charge, marked IDEMPOTENT for one call.
    let mut request = Request::new(charge(900 + Code::Internal as u64, 1));
    request
        .extensions_mut()
        .insert(IdempotencyLevel::Idempotent);
    let status = reads.charge(request).await.unwrap_err();
    assert_eq!(status.classify(), ErrorClass::Retryable);
    let status = reads
        .charge(charge(900 + Code::Internal as u64, 1))
        .await
        .unwrap_err();
    assert_eq!(
        status.classify(),
        ErrorClass::Unknown,
        "not marked: side effects"
    );
}

/// A charge as the order side keeps it (samekey stores it with serde).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Charge {
    charge_id: u64,
    order_id: u64,
}

impl From<ChargeReply> for Charge {
    fn from(reply: ChargeReply) -> Charge {
        Charge {
            charge_id: reply.charge_id,
            order_id: reply.order_id,
        }
    }
}

/// Replaces the first `n` replies with `UNAVAILABLE` after the method ran (a reply lost after the
/// charge), outside the idempotency layer.
#[derive(Clone)]
struct LoseReplies<S> {
    inner: S,
    left: Arc<AtomicUsize>,
}

impl<S, B> tower::Service<http::Request<B>> for LoseReplies<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>> + Send,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, S::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let lose = request.uri().path().ends_with("/Charge")
            && self
                .left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        let called = self.inner.call(request);
        Box::pin(async move {
            let response = called.await?;
            if lose {
                return Ok(Status::unavailable("reply lost").into_http());
            }
            Ok(response)
        })
    }
}

struct Orders {
    rt: Runtime,
    payments: PaymentsClient<samekey_grpc::CallMetadata<Channel>>,
    receipts: samekey_grpc::proto::receipts_client::ReceiptsClient<Channel>,
}

impl Orders {
    #[idempotent(key = "order_id", scope = "orders.pay", runtime = &self.rt, timeout = "2s",
                 retries = 4, backoff = "10ms..50ms",
                 lookup = |call| lookup_receipt::<ChargeReply, _, _>(self.receipts.clone(), call))]
    async fn pay(&self, order_id: u64) -> Result<Charge, Status> {
        let reply = self.payments.clone().charge(charge(order_id, 700)).await?;
        Ok(reply.into_inner().into())
    }
}

#[tokio::test]
async fn a_lost_reply_is_retried_under_one_identity_and_replayed() {
    let ledger = Arc::new(Ledger::default());
    let rt = Runtime::builder().node("pay-1").build().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let left = Arc::new(AtomicUsize::new(2));
    let lose = left.clone();
    let router = Server::builder()
        .layer(tower::layer::layer_fn(move |inner| LoseReplies {
            inner,
            left: lose.clone(),
        }))
        .layer(CallContextLayer::new())
        .layer(IdempotencyLayer::new().runtime(&rt))
        .add_service(PaymentsServer::new(Pay(ledger.clone())))
        .add_service(receipts(&rt));
    tokio::spawn(
        router.serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let orders = Orders {
        rt: Runtime::builder().node("orders-1").build().unwrap(),
        payments: PaymentsClient::new(
            tower::ServiceBuilder::new()
                .layer(CallMetadataLayer::new())
                .service(channel(addr)),
        ),
        receipts: samekey_grpc::proto::receipts_client::ReceiptsClient::new(channel(addr)),
    };
    let paid = orders.pay(42).await.unwrap();
    assert_eq!(paid.order_id, 42);
    assert_eq!(ledger.charges.load(Ordering::SeqCst), 1, "charged once");
    let seen = ledger.seen.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        1,
        "the method ran once; the retries were replayed"
    );
    assert_eq!(left.load(Ordering::SeqCst), 0, "two replies were lost");
    let call_id = seen[0].call_id.clone().unwrap();
    assert_eq!(seen[0].key.as_deref(), Some(call_id.as_str()));
    assert!(seen[0].previous_attempts.is_none(), "the first attempt");
    // The receipt service knows the call by its callId.
    let status = lookup_receipt::<ChargeReply, ChargeReply, _>(
        orders.receipts.clone(),
        &call_id.parse().unwrap(),
    )
    .await
    .unwrap();
    match status {
        RemoteStatus::Succeeded(reply) => assert_eq!(reply.order_id, 42),
        other => panic!("{other:?}"),
    }
    let unknown = lookup_receipt::<ChargeReply, ChargeReply, _>(
        orders.receipts.clone(),
        &samekey::CallId::new("ord", "n9").unwrap(),
    )
    .await
    .unwrap();
    assert!(matches!(unknown, RemoteStatus::NotReceived), "{unknown:?}");
}

struct Flaky {
    rt: Runtime,
    payments: PaymentsClient<samekey_grpc::CallMetadata<Channel>>,
    attempts: AtomicUsize,
}

impl Flaky {
    /// `UNAVAILABLE` twice (nothing ran there), then a charge.
    #[idempotent(key = "order_id", scope = "flaky.pay", runtime = &self.rt, retries = 2,
                 backoff = "1ms..5ms")]
    async fn pay(&self, order_id: u64) -> Result<u64, Status> {
        let n = self.attempts.fetch_add(1, Ordering::SeqCst);
        let order = if n < 2 {
            900 + Code::Unavailable as u64
        } else {
            order_id
        };
        let reply = self.payments.clone().charge(charge(order, 1)).await?;
        Ok(reply.into_inner().charge_id)
    }
}

/// The client layer stamps every attempt with one identity, and counts the attempts before.
#[tokio::test]
async fn retries_carry_one_call_id_and_their_previous_attempts() {
    let ledger = Arc::new(Ledger::default());
    let (addr, _rt) = payment_service(ledger.clone()).await;
    let flaky = Flaky {
        rt: Runtime::builder().node("orders-2").build().unwrap(),
        payments: PaymentsClient::new(
            tower::ServiceBuilder::new()
                .layer(CallMetadataLayer::new())
                .service(channel(addr)),
        ),
        attempts: AtomicUsize::new(0),
    };
    let charged = flaky.pay(7).await;
    assert!(charged.is_ok(), "{charged:?}");
    let seen = ledger.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    let ids: std::collections::HashSet<_> = seen.iter().map(|s| s.call_id.clone()).collect();
    assert_eq!(ids.len(), 1, "one callId: {seen:?}");
    assert!(seen.iter().all(|s| s.key == s.call_id), "{seen:?}");
    let traces: std::collections::HashSet<_> = seen.iter().map(|s| s.trace_id.clone()).collect();
    assert_eq!(traces.len(), 1, "one traceId: {seen:?}");
    assert!(seen[0].trace_id.is_some());
    let previous: Vec<_> = seen.iter().map(|s| s.previous_attempts.clone()).collect();
    assert_eq!(previous, [None, Some("1".into()), Some("2".into())]);
}

#[tokio::test]
async fn traceparent_is_adopted_wins_over_x_trace_id_and_is_passed_on() {
    let ledger = Arc::new(Ledger::default());
    let (addr, _rt) = payment_service(ledger.clone()).await;
    let mut client = PaymentsClient::new(channel(addr));
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let inbound = format!("00-{trace}-00f067aa0ba902b7-01");
    // Adopted, over a disagreeing x-trace-id.
    let mut request = Request::new(charge(20, 1));
    request
        .metadata_mut()
        .insert("traceparent", inbound.parse().unwrap());
    request.metadata_mut().insert(
        X_TRACE_ID,
        "0af7651916cd43dd8448eb211c80319c".parse().unwrap(),
    );
    let reply = client.charge(request).await.unwrap();
    assert_eq!(
        reply.metadata().get(X_TRACE_ID).unwrap(),
        trace,
        "echoed: the traceparent's"
    );
    let ids = ledger.seen.lock().unwrap()[0].ids.clone().unwrap();
    assert_eq!(ids.trace_id.to_string(), trace);
    assert_eq!(
        ids.traceparent.map(|tp| tp.to_string()),
        Some(inbound.clone())
    );
    // Malformed: ignored, the call runs under its x-trace-id.
    let mut request = Request::new(charge(21, 1));
    request
        .metadata_mut()
        .insert("traceparent", "00-not-a-trace".parse().unwrap());
    request.metadata_mut().insert(
        X_TRACE_ID,
        "0af7651916cd43dd8448eb211c80319c".parse().unwrap(),
    );
    client.charge(request).await.unwrap();
    let ids = ledger.seen.lock().unwrap()[1].ids.clone().unwrap();
    assert_eq!(ids.trace_id.to_string(), "0af7651916cd43dd8448eb211c80319c");
    assert!(ids.traceparent.is_none());
    // Passed on by the client layer: from a served call's context, and from a call inside it.
    let layered = PaymentsClient::new(
        tower::ServiceBuilder::new()
            .layer(CallMetadataLayer::new())
            .service(channel(addr)),
    );
    let tp: samekey::TraceParent = inbound.parse().unwrap();
    let flaky = Flaky {
        rt: Runtime::builder().node("orders-3").build().unwrap(),
        payments: layered.clone(),
        attempts: AtomicUsize::new(2),
    };
    samekey::context::InboundCall::new()
        .traceparent(tp)
        .scope(async {
            layered.clone().charge(charge(22, 1)).await.unwrap();
            flaky.pay(23).await.unwrap();
        })
        .await;
    let seen = ledger.seen.lock().unwrap().clone();
    for passed in &seen[2..] {
        let sent = passed.traceparent.clone().expect("a traceparent passed on");
        assert_eq!(
            sent, inbound,
            "the inbound one, forwarded unchanged: {seen:?}"
        );
        assert_eq!(passed.trace_id.as_deref(), Some(trace));
    }
    assert_eq!(seen.len(), 4);
}

/// The receipt service is a read: asked with a key (a lookup through the client layer carries the
/// call's ids), its answer is never the first one replayed.
#[tokio::test]
async fn a_receipt_asked_again_is_answered_afresh() {
    use samekey_grpc::proto::receipts_client::ReceiptsClient;
    use samekey_grpc::proto::{receipt::State, GetReceiptRequest};
    let ledger = Arc::new(Ledger::default());
    let (addr, _rt) = payment_service(ledger.clone()).await;
    let call_id = samekey::CallId::new("ord", "n2").unwrap().to_string();
    let ask = || {
        let mut request = Request::new(GetReceiptRequest {
            call_id: call_id.clone(),
        });
        request
            .metadata_mut()
            .insert(X_CALL_ID, call_id.parse().unwrap());
        request
            .metadata_mut()
            .insert(IDEMPOTENCY_KEY, call_id.parse().unwrap());
        request
    };
    let mut receipts = ReceiptsClient::new(channel(addr));
    let before = receipts.get(ask()).await.unwrap().into_inner();
    assert_eq!(before.state, State::NotReceived as i32);
    let mut request = Request::new(charge(30, 1));
    request
        .metadata_mut()
        .insert(X_CALL_ID, call_id.parse().unwrap());
    PaymentsClient::new(channel(addr))
        .charge(request)
        .await
        .unwrap();
    let after = receipts.get(ask()).await.unwrap().into_inner();
    assert_eq!(after.state, State::Succeeded as i32, "{after:?}");
}

/// A key a client picks never meets a callId used as a key, even when it spells the same.
#[tokio::test]
async fn an_idempotency_key_and_a_call_id_are_different_keys() {
    let ledger = Arc::new(Ledger::default());
    let (addr, _rt) = payment_service(ledger.clone()).await;
    let mut client = PaymentsClient::new(channel(addr));
    let call_id = samekey::CallId::new("ord", "n3").unwrap().to_string();
    let mut by_call_id = Request::new(charge(31, 1));
    by_call_id
        .metadata_mut()
        .insert(X_CALL_ID, call_id.parse().unwrap());
    client.charge(by_call_id).await.unwrap();
    for spelled in [call_id.clone(), format!("call:{call_id}")] {
        client.charge(keyed(charge(32, 2), &spelled)).await.unwrap();
    }
    assert_eq!(ledger.charges.load(Ordering::SeqCst), 3);
}

/// tower's `TimeoutLayer` between the idempotency layer and the method: the timeout drops the method
/// wherever it was, so its outcome is unknown — the key is never given back, and the repeat is
/// `ABORTED` classified `Unknown` (not "not run"), the method not run again.
#[tokio::test]
async fn a_timeout_under_the_layer_holds_the_key_as_unknown() {
    let ledger = Arc::new(Ledger::default());
    *ledger.slow.lock().unwrap() = Some(Duration::from_millis(300));
    let rt = Runtime::builder().node("pay-t").build().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Server::builder()
        .layer(CallContextLayer::new())
        .layer(IdempotencyLayer::new().runtime(&rt))
        .layer(tower::timeout::TimeoutLayer::new(Duration::from_millis(50)))
        .add_service(PaymentsServer::new(Pay(ledger.clone())));
    tokio::spawn(
        router.serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut client = PaymentsClient::new(channel(addr));
    let first = client
        .charge(keyed(charge(40, 1), "k-t"))
        .await
        .unwrap_err();
    assert_ne!(first.code(), Code::Ok);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let again = client
        .charge(keyed(charge(40, 1), "k-t"))
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::Aborted, "{again:?}");
    assert_eq!(again.classify(), ErrorClass::Unknown, "{again:?}");
    assert_eq!(
        ledger.seen.lock().unwrap().len(),
        1,
        "the method was not run again"
    );
}
