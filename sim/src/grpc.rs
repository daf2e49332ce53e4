//! The gRPC wire, in-process: each node serves a unary `Pay` method behind samekey-grpc's
//! `CallContextLayer` and `IdempotencyLayer` (tower, called directly, on the API's store), whose
//! handler charges the gateway itself; customers call it through an `#[idempotent]` function whose
//! client is samekey-grpc's `CallMetadataLayer` over the simulation's network ([`Wire`]).
//!
//! The handler answers as real handlers do: `OK` with the charge; sometimes, after the charge, the
//! status of a nested call's refusal passed up with `?` (`ABORTED`, marked unknown by samekey's
//! `From<Error> for Status`); sometimes a reply larger than the layer stores. The method's messages
//! are JSON in gRPC frames: the layers never decode them.

use std::convert::Infallible;
use std::sync::{Arc, Weak};

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full};
use samekey::{idempotent, Classify, ErrorClass};
use samekey_grpc::{CallContextLayer, CallIds, CallMetadataLayer, IdempotencyLayer};
use serde::{Deserialize, Serialize};
use tonic::body::Body as GrpcBody;
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};

use crate::coverage::{Fault, Surface};
use crate::network::carry;
use crate::payments::{Charged, PayError, Payments};
use crate::store::Life;
use crate::world::{Served, World};

/// The method's path.
pub const PAY: &str = "/sim.v1.Payments/Pay";

/// The largest reply the node's layer stores (a reply past it is passed through once).
pub const MAX_STORED: usize = 16 * 1024;

/// A node's gRPC service: the handler behind the layers.
pub type GrpcService = BoxCloneSyncService<Request<GrpcBody>, Response<GrpcBody>, Infallible>;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PayRequest {
    order: String,
    amount: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PayReply {
    no: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    receipt: String,
}

/// One gRPC message frame: not compressed, its length, the message.
fn frame(message: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + message.len());
    b.put_u8(0);
    b.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    b.put_slice(message);
    b.freeze()
}

/// A unary `OK` reply: the message, then trailers saying so.
fn ok(message: &[u8]) -> Response<GrpcBody> {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let body = Full::new(frame(message))
        .with_trailers(std::future::ready(Some(Ok::<_, Infallible>(trailers))));
    let mut response = Response::new(GrpcBody::new(body));
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    response
}

/// The gRPC service of the node whose service is `payments`, built once per node incarnation.
pub fn service(payments: Weak<Payments>, rt: &samekey::Runtime) -> GrpcService {
    let handler = tower::service_fn(move |req: Request<GrpcBody>| {
        let payments = payments.upgrade();
        async move {
            Ok::<_, Infallible>(match payments {
                Some(payments) => payments.grpc_pay(req).await,
                None => tonic::Status::unavailable("shutting down").into_http(),
            })
        }
    });
    BoxCloneSyncService::new(
        ServiceBuilder::new()
            .layer(CallContextLayer::new())
            .layer(IdempotencyLayer::new().runtime(rt).max_message(MAX_STORED))
            .service(handler),
    )
}

impl Payments {
    /// The `Pay` handler: charges the gateway under the call's callId, then answers.
    async fn grpc_pay(&self, req: Request<GrpcBody>) -> Response<GrpcBody> {
        let ids = req.extensions().get::<CallIds>().cloned();
        let bytes = match req.into_body().collect().await {
            Ok(c) => c.to_bytes(),
            Err(status) => return status.into_http(),
        };
        let Some(pay) = bytes
            .get(5..)
            .and_then(|m| serde_json::from_slice::<PayRequest>(m).ok())
        else {
            return tonic::Status::invalid_argument("not a payment").into_http();
        };
        let Some(call_id) = ids.as_ref().and_then(|i| i.call_id.clone()) else {
            return tonic::Status::invalid_argument("no x-call-id").into_http();
        };
        let trace = ids.map(|i| i.trace_id).unwrap_or_default();
        let charged = self.charge_upstream(&call_id, trace, &pay.order).await;
        let shared = &self.world.shared;
        let (response, said) = match charged {
            Ok(c) => {
                let answer = shared
                    .answer_after_effect([Fault::NestedRefusal, Fault::HugeReply], Surface::Grpc);
                match answer {
                    Some(Fault::NestedRefusal) => {
                        // A nested call (issuing the receipt) refused as busy, passed up with `?`.
                        let nested = samekey::Error::InProgress {
                            call_id: call_id.clone(),
                        };
                        (
                            tonic::Status::from(nested).into_http(),
                            "ABORTED (a nested call's refusal)".to_owned(),
                        )
                    }
                    Some(_) => {
                        let reply = PayReply {
                            no: c.no,
                            receipt: "r".repeat(2 * MAX_STORED),
                        };
                        (
                            ok(&serde_json::to_vec(&reply).unwrap_or_default()),
                            "OK, too large to store".to_owned(),
                        )
                    }
                    None => {
                        let reply = PayReply {
                            no: c.no,
                            receipt: String::new(),
                        };
                        (
                            ok(&serde_json::to_vec(&reply).unwrap_or_default()),
                            "OK".to_owned(),
                        )
                    }
                }
            }
            Err(PayError::Declined) => (
                tonic::Status::failed_precondition("declined").into_http(),
                "FAILED_PRECONDITION".to_owned(),
            ),
            Err(PayError::Refused(why)) => (
                tonic::Status::permission_denied(why).into_http(),
                "PERMISSION_DENIED".to_owned(),
            ),
            Err(PayError::Unavailable) => (
                tonic::Status::unavailable("gateway unavailable").into_http(),
                "UNAVAILABLE".to_owned(),
            ),
            Err(e) => {
                let class = e.classify();
                (
                    tonic::Status::internal(format!("upstream failed ({class:?}): {e}"))
                        .into_http(),
                    "INTERNAL".to_owned(),
                )
            }
        };
        shared.history.log(
            format!("{}/grpc", self.life.name),
            Some(&pay.order),
            format!("handler answers {said}"),
        );
        response
    }

    /// The client side: pays through another node's gRPC method, under this call's callId (the
    /// client layer sends it as `x-call-id` and `idempotency-key`, the same on every attempt).
    #[idempotent(
        key = "order + \"pay\"",
        scope = "sim.pay_grpc",
        runtime = &self.rt,
        timeout = "2s",
        on_unknown = "rerun",
        verify = "amount",
        inputs = "order, amount"
    )]
    pub async fn pay_grpc(&self, order: &str, amount: u64) -> Result<Charged, PayError> {
        let message = serde_json::to_vec(&PayRequest {
            order: order.to_owned(),
            amount,
        })
        .unwrap_or_default();
        let request = Request::builder()
            .method("POST")
            .uri(PAY)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(GrpcBody::new(Full::new(frame(&message))))
            .map_err(|e| PayError::Refused(e.to_string()))?;
        let client = ServiceBuilder::new()
            .layer(CallMetadataLayer::new())
            .service(Wire {
                world: Arc::clone(&self.world),
                life: Arc::clone(&self.life),
            });
        let response = match client.oneshot(request).await {
            Ok(response) => response,
            Err(WireError::Refused) => return Err(PayError::Unavailable),
            Err(WireError::Lost) => return Err(PayError::TimedOut),
        };
        let (parts, body) = response.into_parts();
        let Ok(collected) = body.collect().await else {
            return Err(PayError::TimedOut);
        };
        let trailers = collected.trailers().cloned().unwrap_or_default();
        let bytes = collected.to_bytes();
        let status = tonic::Status::from_header_map(&trailers)
            .or_else(|| tonic::Status::from_header_map(&parts.headers));
        match status {
            Some(s) if s.code() != tonic::Code::Ok => Err(match s.classify() {
                ErrorClass::Permanent => PayError::Refused(s.message().to_owned()),
                ErrorClass::Rejected => PayError::Declined,
                ErrorClass::Retryable => PayError::Unavailable,
                ErrorClass::RateLimited { retry_after } => PayError::Later(retry_after),
                ErrorClass::Unknown => PayError::TimedOut,
            }),
            _ => bytes
                .get(5..)
                .and_then(|m| serde_json::from_slice::<PayReply>(m).ok())
                .map(|r| Charged {
                    no: r.no,
                    trap: Default::default(),
                })
                .ok_or(PayError::TimedOut),
        }
    }
}

/// Why a call over the wire got no response.
#[derive(Debug)]
pub enum WireError {
    /// The node was down: nothing was sent.
    Refused,
    /// The connection broke before a response.
    Lost,
}

/// The network between a gRPC client and a node's service ([`carry`]), as a tower service the
/// client layer wraps.
#[derive(Clone)]
pub struct Wire {
    world: Arc<World>,
    life: Arc<Life>,
}

impl tower::Service<Request<GrpcBody>> for Wire {
    type Response = Response<GrpcBody>;
    type Error = WireError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<GrpcBody>, WireError>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), WireError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<GrpcBody>) -> Self::Future {
        let (world, life) = (Arc::clone(&self.world), Arc::clone(&self.life));
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let Ok(collected) = body.collect().await else {
                return Err(WireError::Lost);
            };
            let request =
                Request::from_parts(parts, GrpcBody::new(Full::new(collected.to_bytes())));
            let served = carry(&world, &life, "grpc", move |p: Arc<Payments>| async move {
                let Ok(response) = p.grpc.clone().oneshot(request).await;
                // The whole reply, trailers included, as it crosses the wire.
                let (parts, body) = response.into_parts();
                match body.collect().await {
                    Ok(c) => {
                        let trailers = c.trailers().cloned();
                        let bytes = c.to_bytes();
                        Response::from_parts(parts, (bytes, trailers))
                    }
                    Err(_) => Response::from_parts(parts, (Bytes::new(), None)),
                }
            })
            .await;
            match served {
                Served::Answered(response) => {
                    let (parts, (bytes, trailers)) = response.into_parts();
                    let body = Full::new(bytes)
                        .with_trailers(std::future::ready(trailers.map(Ok::<_, Infallible>)));
                    Ok(Response::from_parts(parts, GrpcBody::new(body)))
                }
                Served::Refused => Err(WireError::Refused),
                Served::Lost => Err(WireError::Lost),
            }
        })
    }
}
