//! The idempotency layer for unary methods: the `idempotency-key` metadata on samekey's claims and
//! receipts, in gRPC terms.
//!
//! This file holds the layer, its settings and how it reads a call's key; `serve.rs` runs one call
//! through samekey (claim, run once, store, replay, refuse), and `stored.rs` holds what is stored for a
//! key and replayed.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use samekey_runtime::at_most_once::{AtMostOnce, OnBusy, OnUnknown};
use samekey_runtime::grpc_status::IdempotencyLevel;
use samekey_runtime::{context::InboundCall, key::KeyBuilder, key::KeyBytes, CallId, Runtime};
use tonic::{Code, Status};
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument as _;

use crate::metadata::{IDEMPOTENCY_KEY, X_CALL_ID};
use crate::methods::{DescriptorError, Methods};

mod serve;
mod stored;

pub use stored::StoredReply;

/// The longest `idempotency-key` accepted (characters).
pub const MAX_KEY_LEN: usize = 255;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Principal = Arc<dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync>;

/// What becomes of a reply of a status code, and of its key ([`IdempotencyLayer::store_when`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Stored, and replayed to every call that repeats the key.
    Store,
    /// Answered, not stored; the key is given back, so the client may retry: for a status that says
    /// nothing ran (`UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `ABORTED`).
    GiveBack,
    /// Answered, not stored, and the key is not given back: the method may have taken effect before it
    /// failed (`INTERNAL`, `UNKNOWN`, `DATA_LOSS`, `DEADLINE_EXCEEDED`, `CANCELLED`). The call is
    /// recorded `UNKNOWN` and queued for compensation; the key again is `ABORTED` (outcome unknown).
    Hold,
}

/// The default storage policy, mirroring the HTTP layer's "2xx and 4xx stored": `OK` and the
/// caller's errors (`INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, `PERMISSION_DENIED`,
/// `UNAUTHENTICATED`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `UNIMPLEMENTED`) are stored;
/// `UNAVAILABLE`, `RESOURCE_EXHAUSTED` and `ABORTED` give the key back (nothing ran); `INTERNAL`,
/// `UNKNOWN`, `DATA_LOSS`, `DEADLINE_EXCEEDED` and `CANCELLED` hold it (it may have run).
pub fn store_ok_and_caller_errors(code: Code) -> Keep {
    match code {
        Code::Unavailable | Code::ResourceExhausted | Code::Aborted => Keep::GiveBack,
        Code::Internal
        | Code::Unknown
        | Code::DataLoss
        | Code::DeadlineExceeded
        | Code::Cancelled => Keep::Hold,
        _ => Keep::Store,
    }
}

/// The layer's settings, shared by the services it makes.
struct Config {
    runtime: Option<Runtime>,
    ttl: Duration,
    wait: bool,
    rerun_unknown: bool,
    required: bool,
    key_from_call_id: bool,
    max_message: usize,
    retry_after: Duration,
    principal: Option<Principal>,
    store_when: fn(Code) -> Keep,
    methods: Methods,
    /// Made on first use and kept for the process (a call's settings are `'static`).
    spec: OnceLock<&'static AtMostOnce>,
}

impl Clone for Config {
    fn clone(&self) -> Config {
        Config {
            runtime: self.runtime.clone(),
            ttl: self.ttl,
            wait: self.wait,
            rerun_unknown: self.rerun_unknown,
            required: self.required,
            key_from_call_id: self.key_from_call_id,
            max_message: self.max_message,
            retry_after: self.retry_after,
            principal: self.principal.clone(),
            store_when: self.store_when,
            methods: self.methods.clone(),
            spec: OnceLock::new(),
        }
    }
}

impl Config {
    fn spec(&self) -> &'static AtMostOnce {
        self.spec.get_or_init(|| {
            let on_busy = if self.wait {
                OnBusy::Wait
            } else {
                OnBusy::Reject
            };
            let on_unknown = if self.rerun_unknown {
                OnUnknown::Rerun
            } else {
                OnUnknown::Hold
            };
            AtMostOnce::inbound_work("idempotency-key", "grpc", self.ttl, on_busy, on_unknown)
        })
    }
}

/// A tower layer for tonic servers that makes unary methods idempotent by their `idempotency-key`
/// metadata (or, without one, the caller's `x-call-id`), on samekey's claims and receipts:
///
/// | call | answer |
/// |---|---|
/// | first with its key | the method's reply; stored if the policy says so ([`store_ok_and_caller_errors`]) |
/// | the key again, same request message, after that | the stored reply (message, status, the trailing metadata that belongs to it), marked `idempotent-replayed: true`; the method does not run |
/// | the key again while the first still runs | `ABORTED` with a `google.rpc.RetryInfo` and `grpc-retry-pushback-ms` (or, with [`wait_when_busy`](IdempotencyLayer::wait_when_busy), the first's reply) |
/// | the key again with another request message | `FAILED_PRECONDITION` |
/// | the key again after a reply the policy holds (`INTERNAL`, …) or a failed inner service | `ABORTED` (outcome unknown, with retry info); the method does not run again (unless [`rerun_unknown`](IdempotencyLayer::rerun_unknown)) |
/// | a malformed key (not visible ASCII, over 255 characters) | `INVALID_ARGUMENT` |
/// | a key on a streaming method (declared by the descriptors, or a request of other than one message) | `UNIMPLEMENTED`; nothing runs |
/// | a reply found to be a stream (a second message, or no end within 100 ms of its first), or over the limit | passed to the first client as it comes, not buffered; an `UNIMPLEMENTED` (not replayable) is stored for the key at once, so a retry never runs the method again |
/// | a method whose `idempotency_level` is `NO_SIDE_EFFECTS` (a read; `samekey.v1.Receipts/Get` always) | passed through: nothing to run once, and its answer stays current |
/// | a request message over the limit (4 MiB by default) | `RESOURCE_EXHAUSTED`; nothing runs |
/// | the store failing | `UNAVAILABLE`; nothing runs |
///
/// **Why `FAILED_PRECONDITION` for a key reused with another request.** The gRPC status-code guide
/// keeps `INVALID_ARGUMENT` for arguments that are wrong "regardless of the state of the system", and
/// `FAILED_PRECONDITION` for a request refused because "the system is not in a state required for the
/// operation's execution". A request whose key was used before with another message is valid on its
/// own: it is refused only because of what the store holds for the key — system state. `ABORTED` is
/// the guide's code for concurrency conflicts, which this layer answers to a key still in flight.
/// Google's AIP-155 (request identification) asks that a repeated request id be answered with the
/// first response, which is what the layer does for the same message.
///
/// A key is scoped by the full method name (`/pay.v1.Payments/Charge`) and, through
/// [`principal`](IdempotencyLayer::principal), the caller's identity. The fingerprint compared on a
/// repeat is the request message's bytes as sent (a client that compresses must compress its retries
/// alike). The method runs to its end even when the client goes away or its deadline passes (it is
/// spawned), so that a client that retries gets the reply it missed.
///
/// Put it inside the [`CallContextLayer`](crate::CallContextLayer), so that the call adopts the
/// caller's callId. Build it once: its settings are kept for the life of the process.
#[derive(Clone)]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

impl Default for IdempotencyLayer {
    fn default() -> Self {
        IdempotencyLayer::new()
    }
}

impl IdempotencyLayer {
    /// The layer on the ambient runtime, with the defaults above: a call without a key runs unprotected
    /// (see [`required`](IdempotencyLayer::required)), the callId as the key when there is no
    /// `idempotency-key`, 4 MiB, 24 h, `ABORTED` when busy.
    pub fn new() -> IdempotencyLayer {
        IdempotencyLayer {
            config: Arc::new(Config {
                runtime: None,
                ttl: Duration::from_secs(24 * 60 * 60),
                wait: false,
                rerun_unknown: false,
                required: false,
                key_from_call_id: true,
                max_message: 4 * 1024 * 1024,
                retry_after: Duration::from_secs(1),
                principal: None,
                store_when: store_ok_and_caller_errors,
                methods: Methods::samekey(),
                spec: OnceLock::new(),
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Config)) -> IdempotencyLayer {
        let config = Arc::make_mut(&mut self.config);
        change(config);
        config.spec = OnceLock::new();
        self
    }

    /// Keys claimed and replies stored on `runtime`'s store.
    pub fn runtime(self, runtime: &Runtime) -> IdempotencyLayer {
        let runtime = runtime.clone();
        self.with(|c| c.runtime = Some(runtime))
    }

    /// How long a stored reply is replayed (default 24 h).
    pub fn ttl(self, ttl: Duration) -> IdempotencyLayer {
        self.with(|c| c.ttl = ttl)
    }

    /// A call with neither an `idempotency-key` nor an `x-call-id` is refused (`INVALID_ARGUMENT`)
    /// instead of run unprotected.
    pub fn required(self) -> IdempotencyLayer {
        self.with(|c| c.required = true)
    }

    /// Only the `idempotency-key` metadata is a key; the `x-call-id` is not used as one.
    pub fn key_only(self) -> IdempotencyLayer {
        self.with(|c| c.key_from_call_id = false)
    }

    /// The largest request message (and stored reply) in bytes (default 4 MiB, gRPC's default).
    pub fn max_message(self, bytes: usize) -> IdempotencyLayer {
        self.with(|c| c.max_message = bytes)
    }

    /// A call with the key of one still running waits for its reply (as long as the runtime's busy
    /// wait) instead of `ABORTED`.
    pub fn wait_when_busy(self) -> IdempotencyLayer {
        self.with(|c| c.wait = true)
    }

    /// The wait an `ABORTED` asks for (default 1 s).
    pub fn retry_after(self, after: Duration) -> IdempotencyLayer {
        self.with(|c| c.retry_after = after)
    }

    /// The caller's identity (an authenticated peer, a tenant), read from the request: part of the key.
    pub fn principal(
        self,
        principal: impl Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static,
    ) -> IdempotencyLayer {
        let principal: Principal = Arc::new(principal);
        self.with(|c| c.principal = Some(principal))
    }

    /// Which replies are stored (default [`store_ok_and_caller_errors`]).
    pub fn store_when(self, keep: fn(Code) -> Keep) -> IdempotencyLayer {
        self.with(|c| c.store_when = keep)
    }

    /// After a reply the policy holds, or a failed inner service, run the method again for the next
    /// call with its key (under the same callId) instead of `ABORTED`: for methods whose effects are
    /// idempotent themselves.
    pub fn rerun_unknown(self) -> IdempotencyLayer {
        self.with(|c| c.rerun_unknown = true)
    }

    /// The services' protobuf descriptors (an encoded `FileDescriptorSet`, e.g.
    /// `tonic::include_file_descriptor_set!("pay.v1")`): their streaming methods are refused with a
    /// key before they run, instead of found out by their messages.
    pub fn descriptors(self, encoded: &[u8]) -> Result<IdempotencyLayer, DescriptorError> {
        let mut methods = self.config.methods.clone();
        methods.add_descriptor_set(encoded)?;
        Ok(self.with(|c| c.methods = methods))
    }

    /// Declares a method streaming (`/pkg.Service/Method`): refused with a key.
    pub fn streaming(self, path: &str) -> IdempotencyLayer {
        let path = path.to_owned();
        self.with(|c| c.methods.set_streaming(&path))
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Idempotency<S> {
        Idempotency {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service of [`IdempotencyLayer`].
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> std::fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency").finish_non_exhaustive()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A call's key: its `idempotency-key`, else (unless [`IdempotencyLayer::key_only`]) its `x-call-id`,
/// each tagged with where it came from, so that a client's key never meets another's callId.
fn key_of(headers: &http::HeaderMap, config: &Config) -> Result<Option<String>, Status> {
    if let Some(value) = headers.get(IDEMPOTENCY_KEY) {
        let invalid = |why: &str| {
            Status::invalid_argument(format!(
                "the `idempotency-key` metadata must be 1 to {MAX_KEY_LEN} visible ASCII characters, the same on every retry of one operation ({why})"
            ))
        };
        let key = value
            .to_str()
            .map_err(|_| invalid("it is not visible ASCII"))?;
        let key = key.trim();
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(invalid("its length"));
        }
        return Ok(Some(format!("key:{key}")));
    }
    if !config.key_from_call_id {
        return Ok(None);
    }
    Ok(headers
        .get(X_CALL_ID)
        .and_then(|v| v.to_str().ok())
        .and_then(|text| text.trim().parse::<CallId>().ok())
        .map(|id| format!("call:{id}")))
}

/// The refusal of a call whose reply could not be stored and replayed, before anything ran.
fn streaming_refused(path: &str, why: &str) -> Status {
    Status::unimplemented(format!(
        "{path} cannot be made idempotent: {why}; a streamed call cannot be replayed. Call it without `idempotency-key` (and without `x-call-id` as its key), or give it a unary method"
    ))
}

impl<S, ResBody> Service<Request<tonic::body::Body>> for Idempotency<S>
where
    S: Service<Request<tonic::body::Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<tonic::body::Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<tonic::body::Body>) -> Self::Future {
        // The service that was polled ready serves this call; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        let refuse = |status: Status| -> Self::Future {
            Box::pin(std::future::ready(Ok(status.into_http())))
        };
        let key = match key_of(request.headers(), &config) {
            Ok(Some(key)) => key,
            Ok(None) if !config.required => {
                return Box::pin(async move { Ok(inner.call(request).await?.map(tonic::body::Body::new)) })
            }
            Ok(None) => {
                return refuse(Status::invalid_argument(format!(
                    "{} needs an `idempotency-key` metadata entry (a unique string per operation, the same on every retry) or an `x-call-id`",
                    request.uri().path()
                )))
            }
            Err(status) => return refuse(status),
        };
        let path = request.uri().path().to_owned();
        let method = config.methods.get(&path);
        // A read changes nothing: nothing to run once, and its answer must stay current (a receipt
        // asked again must not get the first answer replayed).
        if method.is_some_and(|m| m.level == IdempotencyLevel::NoSideEffects) {
            return Box::pin(
                async move { Ok(inner.call(request).await?.map(tonic::body::Body::new)) },
            );
        }
        if method.is_some_and(|m| m.streaming) {
            return refuse(streaming_refused(&path, "it is a streaming method"));
        }
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body = match Limited::new(body, config.max_message).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => {
                    let too_large = e
                        .downcast_ref::<http_body_util::LengthLimitError>()
                        .is_some();
                    let status = if too_large {
                        Status::resource_exhausted(format!(
                            "an idempotent call's request is kept to check repeats, up to {} bytes",
                            config.max_message
                        ))
                    } else {
                        Status::cancelled(format!("the request could not be read: {e}"))
                    };
                    return Ok(status.into_http());
                }
            };
            match stored::frames(&body) {
                Some(1) => {}
                Some(n) => {
                    return Ok(streaming_refused(
                        &path,
                        &format!("its request holds {n} messages (a client stream)"),
                    )
                    .into_http())
                }
                None => {
                    return Ok(
                        Status::invalid_argument("the request is not a whole gRPC message")
                            .into_http(),
                    )
                }
            }
            let principal = config.principal.as_ref().and_then(|p| p(&parts));
            let scope = format!("grpc:{path}");
            let mut key_parts = KeyBuilder::new(&scope);
            key_parts.part(&principal);
            key_parts.part(key.as_str());
            let mut verify = KeyBuilder::new(&scope);
            verify.part(&KeyBytes(&body));
            let request = Request::from_parts(
                parts,
                tonic::body::Body::new(http_body_util::Full::new(body)),
            );
            // Spawned, so that the method runs to its end (and its reply is stored) even if the client
            // goes away; the call context and tracing span go with it.
            let serving = serve::serve(inner, request, config.clone(), key_parts, verify);
            let served = match InboundCall::current() {
                Some(inbound) => tokio::spawn(inbound.scope(serving).in_current_span()),
                None => tokio::spawn(serving.in_current_span()),
            };
            match served.await {
                Ok(answer) => answer,
                Err(_) => Ok(Status::unknown(
                    "the method stopped before it answered; the outcome of this call is unknown",
                )
                .into_http()),
            }
        })
    }
}
