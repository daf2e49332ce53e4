//! The client side: a tower layer for tonic channels that carries the call's identity on every attempt
//! and marks a method's idempotency level on its failures, and a receipt lookup.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::BodyExt as _;
use samekey_runtime::grpc_status::IdempotencyLevel;
use samekey_runtime::{context::Context, CallId, RemoteStatus};
use tonic::Status;
use tower_layer::Layer;
use tower_service::Service;

use crate::metadata::{
    GRPC_PREVIOUS_RPC_ATTEMPTS, IDEMPOTENCY_KEY, IDEMPOTENCY_LEVEL, TRACEPARENT, X_CALL_ID,
    X_TRACE_ID,
};
use crate::methods::{DescriptorError, Methods};
use crate::proto::receipt::State;
use crate::proto::receipts_client::ReceiptsClient;
use crate::proto::GetReceiptRequest;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type KeyOf = Arc<dyn Fn(&Context) -> String + Send + Sync>;

/// A tower layer for tonic channels (or a tonic interceptor, [`tonic::service::Interceptor`]): inside
/// an `#[idempotent]` call, every request carries the call's identity — `x-call-id`, `x-trace-id`, the
/// W3C `traceparent` ([`Context::traceparent`]) and `idempotency-key` (the callId, or what
/// [`key`](CallMetadataLayer::key) maps the call to), the same on every attempt — and, from the second
/// attempt on, gRFC A6's `grpc-previous-rpc-attempts`. Entries the request already has are left as
/// they are. Outside a call but inside a served call's context, it sends the trace only
/// (`traceparent` and `x-trace-id`); outside both it adds nothing.
///
/// As a layer it also marks a failed call of a method whose `idempotency_level` is `NO_SIDE_EFFECTS`
/// or `IDEMPOTENT` (from the [`descriptors`](CallMetadataLayer::descriptors), from
/// [`level`](CallMetadataLayer::level), or for one call from an [`IdempotencyLevel`] in its request's
/// extensions, which wins) with `samekey-idempotency-level` metadata, so that the status's
/// [`Classify`](samekey_runtime::Classify) resends it where it would otherwise ask the receipt.
///
/// ```
/// # async fn demo() {
/// let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051").connect_lazy();
/// let channel = tower::ServiceBuilder::new()
///     .layer(samekey_grpc::CallMetadataLayer::new())
///     .service(channel);
/// let client = samekey_grpc::proto::receipts_client::ReceiptsClient::new(channel);
/// # let _ = client; }
/// ```
#[derive(Clone)]
pub struct CallMetadataLayer {
    key: Option<KeyOf>,
    methods: Methods,
}

impl std::fmt::Debug for CallMetadataLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallMetadataLayer").finish_non_exhaustive()
    }
}

impl Default for CallMetadataLayer {
    fn default() -> Self {
        CallMetadataLayer::new()
    }
}

impl CallMetadataLayer {
    /// The layer, with the callId as `idempotency-key` (none on a `NO_SIDE_EFFECTS` method, samekey's
    /// `Receipts/Get` among them).
    pub fn new() -> CallMetadataLayer {
        CallMetadataLayer {
            key: None,
            methods: Methods::samekey(),
        }
    }

    /// Maps a call to the `idempotency-key` it sends (a business id, the key's digest) instead of its
    /// callId. It is called for every attempt: make it depend on the call only.
    pub fn key(mut self, key: impl Fn(&Context) -> String + Send + Sync + 'static) -> Self {
        self.key = Some(Arc::new(key));
        self
    }

    /// The methods' levels from protobuf descriptors (an encoded `FileDescriptorSet`).
    pub fn descriptors(mut self, encoded: &[u8]) -> Result<Self, DescriptorError> {
        self.methods.add_descriptor_set(encoded)?;
        Ok(self)
    }

    /// One method's level (`/pkg.Service/Method`), over what the descriptors say.
    pub fn level(mut self, path: &str, level: IdempotencyLevel) -> Self {
        self.methods.set_level(path, level);
        self
    }

    /// Sets the entries of `cx` on `headers`, leaving the ones already there.
    fn stamp(&self, cx: &Context, headers: &mut HeaderMap, level: IdempotencyLevel) {
        let key = match &self.key {
            Some(key) => key(cx),
            None => cx.call_id().to_string(),
        };
        let values = [
            (X_CALL_ID, cx.call_id().to_string()),
            (X_TRACE_ID, cx.trace_id().to_string()),
            (TRACEPARENT, cx.traceparent().to_string()),
            (IDEMPOTENCY_KEY, key),
        ];
        for (name, value) in values {
            // A read has no effect to deduplicate: it carries the call's ids, not a key.
            if name == IDEMPOTENCY_KEY && level == IdempotencyLevel::NoSideEffects {
                continue;
            }
            if !headers.contains_key(name) {
                if let Ok(value) = HeaderValue::from_str(&value) {
                    headers.insert(name, value);
                }
            }
        }
        if cx.attempt() > 1 {
            headers.insert(
                GRPC_PREVIOUS_RPC_ATTEMPTS,
                HeaderValue::from(cx.attempt() - 1),
            );
        }
    }

    /// Stamps a request: the call's identity inside a call, the trace only inside a served call.
    fn stamp_current(&self, headers: &mut HeaderMap, level: IdempotencyLevel) {
        if let Some(cx) = samekey_runtime::context::try_current() {
            self.stamp(&cx, headers, level);
        } else if let Some(tp) = samekey_runtime::context::outbound_traceparent() {
            for (name, value) in [
                (TRACEPARENT, tp.to_string()),
                (X_TRACE_ID, tp.trace_id().to_string()),
            ] {
                if !headers.contains_key(name) {
                    if let Ok(value) = HeaderValue::from_str(&value) {
                        headers.insert(name, value);
                    }
                }
            }
        }
    }
}

impl tonic::service::Interceptor for CallMetadataLayer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        let mut headers = std::mem::take(request.metadata_mut()).into_headers();
        self.stamp_current(&mut headers, IdempotencyLevel::Unknown);
        *request.metadata_mut() = tonic::metadata::MetadataMap::from_headers(headers);
        Ok(request)
    }
}

impl<S> Layer<S> for CallMetadataLayer {
    type Service = CallMetadata<S>;

    fn layer(&self, inner: S) -> CallMetadata<S> {
        CallMetadata {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`CallMetadataLayer`].
#[derive(Clone)]
pub struct CallMetadata<S> {
    inner: S,
    layer: CallMetadataLayer,
}

impl<S> std::fmt::Debug for CallMetadata<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallMetadata").finish_non_exhaustive()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for CallMetadata<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<tonic::body::Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let level = request
            .extensions()
            .get::<IdempotencyLevel>()
            .copied()
            .or_else(|| {
                self.layer
                    .methods
                    .get(request.uri().path())
                    .map(|m| m.level)
            })
            .unwrap_or_default();
        self.layer.stamp_current(request.headers_mut(), level);
        let called = self.inner.call(request);
        Box::pin(async move {
            let response = called.await?;
            if !level.safe_to_resend() {
                return Ok(response.map(tonic::body::Body::new));
            }
            let mark = HeaderValue::from_static(level.as_str());
            let (mut parts, body) = response.into_parts();
            // A trailers-only failure's status is read from the headers, another's from the trailers.
            parts.headers.insert(IDEMPOTENCY_LEVEL, mark.clone());
            let body = body.map_frame(move |frame| match frame.into_trailers() {
                Ok(mut trailers) => {
                    trailers.insert(IDEMPOTENCY_LEVEL, mark.clone());
                    http_body::Frame::trailers(trailers)
                }
                Err(frame) => frame,
            });
            Ok(Response::from_parts(parts, tonic::body::Body::new(body)))
        })
    }
}

/// Asks a service's receipt service (`samekey.v1.Receipts/Get`, see [`receipts`](crate::receipts))
/// about a callId, as the `RemoteStatus` an `#[idempotent]` function's `lookup` answers: a reply the
/// service's idempotency layer stored with `OK` as its message decoded as `T`, a failure as its
/// status, a call still running (or whose outcome is not known there) as `Processing`, an unknown
/// callId as `NotReceived`. A receipt whose value does not decode as `M` is a failed lookup
/// (`INTERNAL`), never taken for an answer. The message becomes the function's `T` by `From` (`M`
/// itself, or the function's own serde type):
///
/// ```text
/// #[idempotent(key = "order_id", lookup = |call| lookup_receipt::<ChargeReply, _, _>(self.receipts.clone(), call))]
/// async fn charge(&self, order_id: u64) -> Result<Charge, tonic::Status> { … }
/// ```
pub async fn lookup_receipt<M, T, C>(
    mut client: ReceiptsClient<C>,
    call_id: &CallId,
) -> Result<RemoteStatus<T, Status>, Status>
where
    M: prost::Message + Default,
    T: From<M>,
    C: tonic::client::GrpcService<tonic::body::Body>,
    C::Error: Into<BoxError>,
    C::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <C::ResponseBody as Body>::Error: Into<BoxError> + Send,
{
    let mut request = tonic::Request::new(GetReceiptRequest {
        call_id: call_id.to_string(),
    });
    request
        .extensions_mut()
        .insert(IdempotencyLevel::NoSideEffects);
    let receipt = client.get(request).await?.into_inner();
    Ok(match State::try_from(receipt.state) {
        Ok(State::Succeeded) => match M::decode(receipt.value.as_slice()) {
            Ok(value) => RemoteStatus::Succeeded(T::from(value)),
            Err(e) => {
                return Err(Status::internal(format!(
                    "the receipt of call {call_id} holds a value that does not decode: {e}"
                )))
            }
        },
        Ok(State::Failed) => RemoteStatus::Failed(Status::new(
            tonic::Code::from(receipt.code),
            receipt.message,
        )),
        Ok(State::Processing) => RemoteStatus::Processing,
        Ok(State::NotReceived) => RemoteStatus::NotReceived,
        Ok(State::Unspecified) | Err(_) => {
            return Err(Status::internal(format!(
                "the receipt service answered a state this client does not know ({})",
                receipt.state
            )))
        }
    })
}
