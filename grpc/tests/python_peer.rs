//! A client no one here wrote: Python's `grpcio` calls the Rust payment service with its own retry
//! policy (gRFC A6, `UNAVAILABLE` retryable) and its own `idempotency-key` metadata. A reply lost
//! after the charge (a layer outside the idempotency layer replaces it with `UNAVAILABLE`) is retried
//! by grpcio and replayed, not charged twice; a different request under the same key is refused.
//!
//! Needs `python3` with `grpcio` and `grpcio-tools` (`.ci/run` installs them with pip); without them
//! it prints a `skipped:` line.

use std::process::Command;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use samekey::Runtime;
use samekey_grpc::{CallContextLayer, IdempotencyLayer};
use tonic::transport::Server;
use tonic::{Request, Response, Status};

#[path = "../examples/proto/mod.rs"]
mod proto;

use proto::payments_server::{Payments, PaymentsServer};
use proto::{ChargeReply, ChargeRequest, GetChargeRequest};

#[derive(Default)]
struct Ledger {
    charges: AtomicU64,
    /// `grpc-previous-rpc-attempts` of each call that reached the service (before the layers).
    previous_attempts: Mutex<Vec<Option<String>>>,
}

struct Pay(Arc<Ledger>);

#[tonic::async_trait]
impl Payments for Pay {
    async fn charge(
        &self,
        request: Request<ChargeRequest>,
    ) -> Result<Response<ChargeReply>, Status> {
        let ChargeRequest {
            order_id,
            amount_cents,
        } = request.into_inner();
        let charge_id = self.0.charges.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Response::new(ChargeReply {
            charge_id,
            order_id,
            amount_cents,
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

/// Loses the first `Charge` reply after the method ran: `UNAVAILABLE` in its place.
#[derive(Clone)]
struct LoseFirstReply<S> {
    inner: S,
    left: Arc<AtomicUsize>,
    ledger: Arc<Ledger>,
}

impl<S, B> tower::Service<http::Request<B>> for LoseFirstReply<S>
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
        let previous = request
            .headers()
            .get("grpc-previous-rpc-attempts")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.ledger
            .previous_attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(previous);
        let lose = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let called = self.inner.call(request);
        Box::pin(async move {
            let response = called.await?;
            if lose {
                return Ok(Status::unavailable("reply lost after the charge").into_http());
            }
            Ok(response)
        })
    }
}

const CLIENT: &str = r#"
import json, sys
sys.path.insert(0, sys.argv[1])
import grpc
import payments_pb2, payments_pb2_grpc

config = json.dumps({"methodConfig": [{
    "name": [{"service": "pay.v1.Payments"}],
    "retryPolicy": {
        "maxAttempts": 4,
        "initialBackoff": "0.01s",
        "maxBackoff": "0.1s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"],
    },
}]})
channel = grpc.insecure_channel(sys.argv[2], options=[
    ("grpc.service_config", config),
    ("grpc.enable_retries", 1),
])
stub = payments_pb2_grpc.PaymentsStub(channel)
key = [("idempotency-key", "py-order-77")]
reply, call = stub.Charge.with_call(
    payments_pb2.ChargeRequest(order_id=77, amount_cents=500), metadata=key, timeout=10)
out = {
    "charge_id": reply.charge_id,
    "replayed": dict(call.initial_metadata()).get("idempotent-replayed"),
}
again = stub.Charge(payments_pb2.ChargeRequest(order_id=77, amount_cents=500), metadata=key, timeout=10)
out["again_charge_id"] = again.charge_id
try:
    stub.Charge(payments_pb2.ChargeRequest(order_id=77, amount_cents=999), metadata=key, timeout=10)
    out["other_request"] = "OK"
except grpc.RpcError as e:
    out["other_request"] = e.code().name
    out["other_request_message"] = e.details()
print(json.dumps(out))
"#;

fn python_has_grpc() -> bool {
    Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .output()
        .is_ok_and(|out| out.status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_retries_a_lost_reply_into_a_replay_and_a_reused_key_is_refused() {
    if !python_has_grpc() {
        println!("skipped: pip install grpcio grpcio-tools (python3) to check the wire contract with grpcio");
        return;
    }
    let stubs = tempfile::tempdir().expect("a temporary directory");
    let proto_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/proto");
    let generated = Command::new("python3")
        .args(["-m", "grpc_tools.protoc", "-I", proto_dir])
        .arg(format!("--python_out={}", stubs.path().display()))
        .arg(format!("--grpc_python_out={}", stubs.path().display()))
        .arg(format!("{proto_dir}/payments.proto"))
        .output()
        .expect("run grpc_tools.protoc");
    assert!(
        generated.status.success(),
        "{}",
        String::from_utf8_lossy(&generated.stderr)
    );

    let ledger = Arc::new(Ledger::default());
    let rt = Runtime::builder().node("pay-py").build().expect("runtime");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("its address");
    let (lose, seen) = (Arc::new(AtomicUsize::new(1)), ledger.clone());
    let router = Server::builder()
        .layer(tower::layer::layer_fn(move |inner| LoseFirstReply {
            inner,
            left: lose.clone(),
            ledger: seen.clone(),
        }))
        .layer(CallContextLayer::new())
        .layer(IdempotencyLayer::new().runtime(&rt))
        .add_service(PaymentsServer::new(Pay(ledger.clone())));
    tokio::spawn(
        router.serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );

    let script = stubs.path().join("client.py");
    std::fs::write(&script, CLIENT).expect("write the client");
    let (dir, target) = (stubs.path().to_owned(), addr.to_string());
    let ran = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(&script)
            .arg(&dir)
            .arg(&target)
            .output()
    })
    .await
    .expect("the client's task")
    .expect("run the Python client");
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let out: serde_json::Value =
        serde_json::from_slice(&ran.stdout).expect("the client's JSON line");
    assert_eq!(
        ledger.charges.load(Ordering::SeqCst),
        1,
        "charged once: {out}"
    );
    assert_eq!(out["charge_id"], 1, "{out}");
    assert_eq!(
        out["replayed"], "true",
        "grpcio's retry was replayed: {out}"
    );
    assert_eq!(out["again_charge_id"], 1, "{out}");
    assert_eq!(out["other_request"], "FAILED_PRECONDITION", "{out}");
    let previous = ledger
        .previous_attempts
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    assert_eq!(
        previous.get(1).cloned().flatten().as_deref(),
        Some("1"),
        "grpcio's retry said it was one (gRFC A6): {previous:?}"
    );
}
