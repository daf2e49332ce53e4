//! The layers' added latency on a unary call, side by side in one run, over real gRPC on loopback: a
//! bare tonic service; the same behind `CallContextLayer` + `IdempotencyLayer` (memory store) with a
//! fresh `idempotency-key` per call (claim, run, store the reply); and with one key again and again
//! (a replay: one read, the method does not run). One current-thread tokio runtime drives client
//! and servers.
//!
//! ```text
//! cargo bench -p samekey-grpc --bench unary
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{criterion_group, criterion_main, Criterion};
use samekey::Runtime;
use samekey_grpc::metadata::IDEMPOTENCY_KEY;
use samekey_grpc::{CallContextLayer, IdempotencyLayer};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

#[path = "../examples/proto/mod.rs"]
mod proto;

use proto::payments_client::PaymentsClient;
use proto::payments_server::{Payments, PaymentsServer};
use proto::{ChargeReply, ChargeRequest, GetChargeRequest};

struct Pay;

#[tonic::async_trait]
impl Payments for Pay {
    async fn charge(
        &self,
        request: Request<ChargeRequest>,
    ) -> Result<Response<ChargeReply>, Status> {
        let request = request.into_inner();
        Ok(Response::new(ChargeReply {
            charge_id: 1,
            order_id: request.order_id,
            amount_cents: request.amount_cents,
        }))
    }

    async fn get_charge(
        &self,
        _: Request<GetChargeRequest>,
    ) -> Result<Response<ChargeReply>, Status> {
        Err(Status::unimplemented("not here"))
    }

    type WatchStream = tokio_stream::Empty<Result<ChargeReply, Status>>;

    async fn watch(
        &self,
        _: Request<GetChargeRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("not here"))
    }
}

async fn listener() -> (tokio_stream::wrappers::TcpListenerStream, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("its address");
    (
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        addr,
    )
}

async fn bare() -> SocketAddr {
    let (incoming, addr) = listener().await;
    let router = Server::builder().add_service(PaymentsServer::new(Pay));
    tokio::spawn(router.serve_with_incoming(incoming));
    addr
}

async fn layered(rt: &Runtime) -> SocketAddr {
    let (incoming, addr) = listener().await;
    let router = Server::builder()
        .layer(CallContextLayer::new())
        .layer(IdempotencyLayer::new().runtime(rt))
        .add_service(PaymentsServer::new(Pay));
    tokio::spawn(router.serve_with_incoming(incoming));
    addr
}

async fn client(addr: SocketAddr) -> PaymentsClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("an address")
        .connect()
        .await
        .expect("connect");
    PaymentsClient::new(channel)
}

fn request(key: Option<String>) -> Request<ChargeRequest> {
    let mut request = Request::new(ChargeRequest {
        order_id: 7,
        amount_cents: 500,
    });
    if let Some(key) = key.and_then(|k| k.parse().ok()) {
        request.metadata_mut().insert(IDEMPOTENCY_KEY, key);
    }
    request
}

fn unary(c: &mut Criterion) {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let (bare, layered) = tokio.block_on(async {
        let rt = Runtime::builder().node("bench").build().expect("runtime");
        let bare = client(bare().await).await;
        let layered = client(layered(&rt).await).await;
        (bare, layered)
    });
    let fresh = AtomicU64::new(0);
    let mut group = c.benchmark_group("grpc_unary");
    group.bench_function("bare tonic", |b| {
        b.to_async(&tokio).iter(|| {
            let mut bare = bare.clone();
            async move { bare.charge(request(None)).await.expect("a reply") }
        })
    });
    group.bench_function("layers, fresh key", |b| {
        b.to_async(&tokio).iter(|| {
            let mut layered = layered.clone();
            let key = format!("order-{}", fresh.fetch_add(1, Ordering::Relaxed));
            async move { layered.charge(request(Some(key))).await.expect("a reply") }
        })
    });
    tokio.block_on(async {
        layered
            .clone()
            .charge(request(Some("replayed".into())))
            .await
            .expect("the first call")
    });
    group.bench_function("layers, replayed", |b| {
        b.to_async(&tokio).iter(|| {
            let mut layered = layered.clone();
            async move {
                layered
                    .charge(request(Some("replayed".into())))
                    .await
                    .expect("a replay")
            }
        })
    });
    group.finish();
}

criterion_group!(benches, unary);
criterion_main!(benches);
