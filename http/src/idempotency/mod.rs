//! The Idempotency-Key layer: the IETF httpapi draft "The Idempotency-Key HTTP Header Field"
//! (draft-07) on samekey's claims and receipts.
//!
//! This file holds the middleware, as tower-http lays one out: its settings, the [`IdempotencyLayer`]
//! that carries them, the [`Idempotency`] service and how it reads a request's key; `serve.rs` runs one
//! request through samekey (claim, run once, store, replay, refuse), and `stored.rs` holds what is
//! stored for a key and replayed.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use samekey_runtime::at_most_once::{AtMostOnce, OnBusy, OnUnknown};
use samekey_runtime::{context::InboundCall, key::KeyBuilder, key::KeyBytes, Runtime};
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument as _;

use crate::headers::IDEMPOTENCY_KEY;
use crate::problem::Problem;

mod serve;
mod stored;

use serve::serve;
pub use stored::StoredResponse;

/// The longest `Idempotency-Key` accepted (characters of the sf-string).
pub const MAX_KEY_LEN: usize = 255;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Principal = Arc<dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync>;

/// The layer's settings, shared by the services it makes.
struct Config {
    runtime: Option<Runtime>,
    ttl: Duration,
    wait: bool,
    rerun_unknown: bool,
    methods: Vec<Method>,
    required: bool,
    max_body: usize,
    retry_after: Duration,
    principal: Option<Principal>,
    store_when: fn(StatusCode) -> bool,
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
            methods: self.methods.clone(),
            required: self.required,
            max_body: self.max_body,
            retry_after: self.retry_after,
            principal: self.principal.clone(),
            store_when: self.store_when,
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
            AtMostOnce::inbound_work("Idempotency-Key", "http", self.ttl, on_busy, on_unknown)
        })
    }
}

/// The default storage policy: 2xx and 4xx responses are stored and replayed; 5xx (and 1xx, 3xx) are
/// not stored and the key is given back, so that the client may retry.
pub fn store_2xx_and_4xx(status: StatusCode) -> bool {
    status.is_success() || status.is_client_error()
}

/// A tower layer that makes `POST` and `PATCH` requests idempotent by their `Idempotency-Key` header,
/// following the IETF httpapi draft (draft-07), on samekey's claims and receipts:
///
/// | request | answer |
/// |---|---|
/// | first with its key | the handler's response; stored if the policy says so (by default 2xx and 4xx) |
/// | the key again, same request, after that | the stored response (status, its headers, body), marked `Idempotent-Replayed: true`; the handler does not run |
/// | the key again while the first still runs | **409** with `Retry-After` (or, with [`wait_when_busy`](IdempotencyLayer::wait_when_busy), the first's response) |
/// | the key again with another method, path or body | **422** |
/// | no key, on a method that needs one | **400** (or the handler, unprotected, with [`optional`](IdempotencyLayer::optional)) |
/// | a malformed key (not an sf-string, over 255 characters) | **400** |
/// | a body over the limit (1 MiB by default) | **413**; nothing runs |
/// | a response not stored (5xx) | answered as it is; the key is given back, so the client may retry |
/// | the inner service fails (an `Err`: a timeout under the layer, tower's `TimeoutLayer`, the handler dropped after it may have taken effect) | the error, as it is (to the layer above, e.g. axum's `HandleErrorLayer`); the outcome is unknown: the call is recorded `UNKNOWN` and queued for compensation, the key is not given back |
/// | the key again after a service error (or a crashed handler) | **409** (`outcome-unknown`, with `Retry-After`), or the outcome once the call is settled; the handler does not run again (unless [`rerun_unknown`](IdempotencyLayer::rerun_unknown)) |
/// | a streamed response (its body's `size_hint` has no upper bound: `Body::from_stream`, SSE) | passed to the first client as it is, not buffered; a **409** (`stream-not-replayable`, the first response's status as `first_status`, no `Retry-After`) is stored for the key at once, so a retry is refused and the handler never runs twice (a streamed 5xx gives the key back, as any 5xx) |
/// | a response over the limit (its body's `size_hint` upper bound is over [`max_body`](IdempotencyLayer::max_body)) | passed to the first client as it is, not buffered, as a stream is; a **409** (`response-not-replayable`, with `first_status` and `max_body`, no `Retry-After`) is stored for the key at once (a 5xx over the limit gives the key back, as any 5xx) |
/// | the key again after a streamed or over-limit response | that **409**, marked `Idempotent-Replayed: true` |
///
/// Refusals carry an RFC 9457 `application/problem+json` body. A key is scoped by method, route (axum's
/// `MatchedPath` with feature `axum`, else the path) and, through [`principal`](IdempotencyLayer::principal),
/// the caller's identity, so that two clients never share one. Its record is a samekey receipt (scope
/// `http:<METHOD> <route>`), on the runtime's store — memory, SQLite, PostgreSQL, Redis — with the same
/// `ttl`, expiry, journal and compensation as any call. The handler runs to its end even when the
/// client goes away (it is spawned), so a client that retries gets the response it missed.
///
/// A request whose handler crashed mid-way (its process died), or whose inner service answered an
/// `Err` (a timeout under the layer), leaves the key's outcome unknown: the next request with the key
/// is answered **409** (`outcome-unknown`) and the call is queued for the compensation worker, unless
/// [`rerun_unknown`](IdempotencyLayer::rerun_unknown) says the handler may run again under the same
/// callId (its own effects idempotent). An error is never taken for "nothing ran": a timeout drops the
/// handler wherever it was, after its effect as well as before. To give a key back, answer a response
/// the policy does not store (a 5xx) instead of an error.
///
/// Build the layer once: its settings are kept for the life of the process.
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
    /// The layer on the ambient runtime (`Runtime::install_default`'s, else an in-memory one), with
    /// the defaults above: `POST` and `PATCH`, key required, 1 MiB, 24 h, 409 when busy.
    pub fn new() -> IdempotencyLayer {
        IdempotencyLayer {
            config: Arc::new(Config {
                runtime: None,
                ttl: Duration::from_secs(24 * 60 * 60),
                wait: false,
                rerun_unknown: false,
                methods: vec![Method::POST, Method::PATCH],
                required: true,
                max_body: 1024 * 1024,
                retry_after: Duration::from_secs(1),
                principal: None,
                store_when: store_2xx_and_4xx,
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

    /// Keys claimed and responses stored on `runtime`'s store.
    pub fn runtime(self, runtime: &Runtime) -> IdempotencyLayer {
        let runtime = runtime.clone();
        self.with(|c| c.runtime = Some(runtime))
    }

    /// How long a stored response is replayed (default 24 h).
    pub fn ttl(self, ttl: Duration) -> IdempotencyLayer {
        self.with(|c| c.ttl = ttl)
    }

    /// The methods that take an `Idempotency-Key` (default `POST`, `PATCH`); others pass through.
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> IdempotencyLayer {
        let methods = methods.into_iter().collect();
        self.with(|c| c.methods = methods)
    }

    /// A request without a key runs, unprotected, instead of a 400.
    pub fn optional(self) -> IdempotencyLayer {
        self.with(|c| c.required = false)
    }

    /// The largest request (and stored response) body, in bytes (default 1 MiB). A larger request is
    /// a 413, and nothing runs. A response that may be larger (its body's `size_hint` upper bound is
    /// over the limit) is not buffered: it goes to its client as it is, and the key is settled with a
    /// 409 (`response-not-replayable`, the response's status as `first_status`), so that a retry does
    /// not run the handler again — as for a streamed response (see [`IdempotencyLayer`]).
    pub fn max_body(self, bytes: usize) -> IdempotencyLayer {
        self.with(|c| c.max_body = bytes)
    }

    /// A request with the key of one still running waits for its response (as long as the runtime's
    /// busy wait) instead of a 409.
    pub fn wait_when_busy(self) -> IdempotencyLayer {
        self.with(|c| c.wait = true)
    }

    /// The `Retry-After` of a 409 (default 1 s).
    pub fn retry_after(self, after: Duration) -> IdempotencyLayer {
        self.with(|c| c.retry_after = after)
    }

    /// The caller's identity (an API key's owner, a tenant), read from the request: part of the key, so
    /// that two callers who pick the same key never share it. `None` when the request has none.
    pub fn principal(
        self,
        principal: impl Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static,
    ) -> IdempotencyLayer {
        let principal: Principal = Arc::new(principal);
        self.with(|c| c.principal = Some(principal))
    }

    /// Which responses are stored and replayed (default [`store_2xx_and_4xx`]); the others are
    /// answered as they are and their key given back.
    pub fn store_when(self, store: fn(StatusCode) -> bool) -> IdempotencyLayer {
        self.with(|c| c.store_when = store)
    }

    /// After a request whose handler crashed mid-way or whose inner service answered an error (a
    /// timeout under the layer), run the handler again for the next request with its key (under the
    /// same callId) instead of answering 409: for handlers whose effects are idempotent themselves.
    /// The request that failed still gets its error.
    pub fn rerun_unknown(self) -> IdempotencyLayer {
        self.with(|c| c.rerun_unknown = true)
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

/// Reads the `Idempotency-Key` header: `Ok(None)` without one, the key, or a 400.
fn idempotency_key(headers: &http::HeaderMap) -> Result<Option<String>, Problem> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let invalid = |why: &str| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "idempotency-key-invalid",
            "Invalid Idempotency-Key",
            format!(
                "the Idempotency-Key header must be a structured-field string of 1 to {MAX_KEY_LEN} characters, e.g. `Idempotency-Key: \"8e03978e-40d5-43e8-bc93-6894a57f9324\"` ({why})"
            ),
        )
    };
    let item: sfv::Item = sfv::Parser::new(value.as_bytes())
        .parse()
        .map_err(|_| invalid("it does not parse as a structured field"))?;
    let Some(key) = item.bare_item.as_string() else {
        return Err(invalid("it is not a quoted string"));
    };
    let key = key.as_str().to_owned();
    if key.is_empty() || key.chars().count() > MAX_KEY_LEN {
        return Err(invalid("its length"));
    }
    Ok(Some(key))
}

/// The route a request was matched to (axum's `MatchedPath`), else its path.
fn route<B>(request: &Request<B>) -> String {
    #[cfg(feature = "axum")]
    if let Some(matched) = request.extensions().get::<axum::extract::MatchedPath>() {
        return matched.as_str().to_owned();
    }
    request.uri().path().to_owned()
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Idempotency<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service that was polled ready serves this request; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        if !config.methods.contains(request.method()) {
            return Box::pin(inner.call(request));
        }
        let key = match idempotency_key(request.headers()) {
            Ok(Some(key)) => key,
            Ok(None) if !config.required => return Box::pin(inner.call(request)),
            Ok(None) => {
                let problem = Problem::new(
                    StatusCode::BAD_REQUEST,
                    "idempotency-key-missing",
                    "Idempotency-Key missing",
                    format!(
                        "{} {} needs an Idempotency-Key header (a unique string per operation, the same on every retry), e.g. `Idempotency-Key: \"8e03978e-40d5-43e8-bc93-6894a57f9324\"`",
                        request.method(),
                        request.uri().path()
                    ),
                );
                return Box::pin(std::future::ready(Ok(problem.response())));
            }
            Err(problem) => return Box::pin(std::future::ready(Ok(problem.response()))),
        };
        let route = route(&request);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body = match Limited::new(body, config.max_body).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => {
                    let too_large = e
                        .downcast_ref::<http_body_util::LengthLimitError>()
                        .is_some();
                    let problem = if too_large {
                        Problem::new(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            "body-too-large",
                            "Request body too large",
                            format!(
                                "an idempotent request's body is kept to check repeats, up to {} bytes",
                                config.max_body
                            ),
                        )
                    } else {
                        Problem::new(
                            StatusCode::BAD_REQUEST,
                            "body-unreadable",
                            "Request body unreadable",
                            format!("the request body could not be read: {e}"),
                        )
                    };
                    return Ok(problem.response());
                }
            };
            let principal = config.principal.as_ref().and_then(|p| p(&parts));
            let scope = format!("http:{} {}", parts.method, route);
            let mut key_parts = KeyBuilder::new(&scope);
            key_parts.part(&principal);
            key_parts.part(key.as_str());
            let mut verify = KeyBuilder::new(&scope);
            verify.part(parts.method.as_str());
            verify.part(&parts.uri.path_and_query().map(|p| p.as_str().to_owned()));
            verify.part(&KeyBytes(&body));
            let request = Request::from_parts(parts, ReqBody::from(body));
            // Spawned, so that the handler runs to its end (and its response is stored) even if the
            // client goes away.
            // The request's call context and tracing span go with it (task-locals stay behind in a
            // spawn).
            let serving = serve(inner, request, config.clone(), key_parts, verify);
            let served = match InboundCall::current() {
                Some(inbound) => tokio::spawn(inbound.scope(serving).in_current_span()),
                None => tokio::spawn(serving.in_current_span()),
            };
            match served.await {
                Ok(answer) => answer,
                Err(_) => Ok(Problem::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "handler-panicked",
                    "Handler failed",
                    "the handler stopped before it answered; the outcome of this request is unknown",
                )
                .response()),
            }
        })
    }
}
