//! The Idempotency-Key layer: the IETF httpapi draft "The Idempotency-Key HTTP Header Field"
//! (draft-07) on samekey's claims and receipts.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{header, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use samekey_runtime::at_most_once::{AtMostOnce, OnBusy, OnUnknown};
use samekey_runtime::{
    context::Inbound, key::KeyBuilder, key::KeyBytes, observe::observed, observe::CallAnswer,
    Classify, Error, ErrorClass, Runtime,
};
use serde::{Deserialize, Serialize};
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument as _;

use crate::headers::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use crate::once;
use crate::problem::Problem;

/// The longest `Idempotency-Key` accepted (characters of the sf-string).
pub const MAX_KEY_LEN: usize = 255;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Principal = Arc<dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync>;

/// A response as the store keeps it, to replay to a request that repeats the key: its status, the
/// headers that belong to it, its body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    /// The status code.
    pub status: u16,
    /// The headers that belong to the response: not the connection's, not `Date` or `Set-Cookie`, not
    /// the request's own ids (`X-Call-Id`, `X-Trace-Id`, `X-Request-Id`), which the replay's request
    /// brings.
    pub headers: Vec<(String, String)>,
    /// The body, base64.
    pub body: String,
}

impl StoredResponse {
    /// Keeps `parts` and `body` (see [`StoredResponse::headers`] for which headers).
    fn keep(parts: &http::response::Parts, body: &[u8]) -> StoredResponse {
        let headers = parts
            .headers
            .iter()
            .filter(|(name, _)| kept(name))
            .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_owned())))
            .collect();
        StoredResponse {
            status: parts.status.as_u16(),
            headers,
            body: base64::engine::general_purpose::STANDARD.encode(body),
        }
    }

    /// The response again.
    fn response<B: From<Bytes>>(&self) -> Result<Response<B>, Problem> {
        let corrupt = |what: &str| {
            Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "stored-response-unreadable",
                "Stored response unreadable",
                format!("the response stored for this key cannot be read back ({what})"),
            )
        };
        let body = base64::engine::general_purpose::STANDARD
            .decode(&self.body)
            .map_err(|_| corrupt("its body"))?;
        let mut response = Response::new(B::from(Bytes::from(body)));
        *response.status_mut() =
            StatusCode::from_u16(self.status).map_err(|_| corrupt("status"))?;
        for (name, value) in &self.headers {
            let name = HeaderName::try_from(name.as_str()).map_err(|_| corrupt("a header"))?;
            let value = HeaderValue::try_from(value.as_str()).map_err(|_| corrupt("a header"))?;
            response.headers_mut().append(name, value);
        }
        Ok(response)
    }
}

/// Whether a response header is part of what is replayed.
fn kept(name: &HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "upgrade"
            | "te"
            | "trailer"
            | "content-length"
            | "date"
            | "set-cookie"
            | "x-call-id"
            | "x-trace-id"
            | "x-call-id-source"
            | "x-request-id"
            | "idempotent-replayed"
    )
}

/// Why the layer's call did not end with a response to store.
#[derive(Debug)]
enum Refusal {
    /// A response of a status the policy does not store (5xx by default): answered, not kept; the
    /// key is given back so that the client may retry.
    NotStored(StoredResponse),
    /// The inner service failed (its error is handed back as it is). Its outcome is unknown: the
    /// usual error is a timeout under the layer (tower's `Timeout`), which drops the handler after it
    /// may have taken effect. The call is recorded `UNKNOWN` and queued for compensation; the key is
    /// not given back.
    ServiceFailed,
    /// A response passed to its client unbuffered (a stream, or a body over the limit) of a status the
    /// policy does not store: handed to its client as it is; the key is given back.
    Unbuffered(StatusCode),
    /// samekey's answer: key reused, in progress, unknown, the store failing.
    Samekey(Error),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NotStored(r) => write!(f, "a response of status {} is not stored", r.status),
            Refusal::ServiceFailed => f.write_str("the service failed"),
            Refusal::Unbuffered(status) => {
                write!(f, "an unbuffered response of status {status} is not stored")
            }
            Refusal::Samekey(e) => e.fmt(f),
        }
    }
}

impl From<Error> for Refusal {
    fn from(e: Error) -> Refusal {
        Refusal::Samekey(e)
    }
}

impl Classify for Refusal {
    fn classify(&self) -> ErrorClass {
        match self {
            Refusal::NotStored(_) | Refusal::Unbuffered(_) => ErrorClass::Rejected,
            Refusal::ServiceFailed => ErrorClass::Unknown,
            Refusal::Samekey(e) => e.classify(),
        }
    }
}

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
            once::operation("Idempotency-Key", "http", self.ttl, on_busy, on_unknown)
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

/// The answer to a refusal by samekey.
fn refused<B: From<Bytes>>(error: &Error, retry_after: Duration) -> Response<B> {
    let (problem, retry) = match error {
        Error::KeyReuse { .. } => (
            Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "Idempotency-Key reused",
                "this Idempotency-Key was used with another request (its method, path or body differ): use a new key for a new request",
            ),
            false,
        ),
        Error::InProgress { .. } => (
            Problem::new(
                StatusCode::CONFLICT,
                "request-in-progress",
                "Request in progress",
                "a request with this Idempotency-Key is still being processed: retry after a while to get its response",
            ),
            true,
        ),
        Error::Unknown { call_id } => (
            Problem::new(
                StatusCode::CONFLICT,
                "outcome-unknown",
                "Outcome unknown",
                format!("the request first made with this Idempotency-Key (call {call_id}) ended without a response, and whether it took effect is not known; it is not run again, and is queued for resolution"),
            ),
            true,
        ),
        Error::Overloaded { .. } => (
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "Overloaded",
                format!("the request was not run: {error}"),
            ),
            true,
        ),
        Error::Store(e) => (
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Idempotency store unavailable",
                format!("the request was not run: its Idempotency-Key cannot be checked now ({e})"),
            ),
            true,
        ),
        other => (
            Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "idempotency-failed",
                "Idempotency failed",
                other.to_string(),
            ),
            false,
        ),
    };
    let mut response = problem.response();
    if retry {
        let secs = retry_after.as_secs().max(1).to_string();
        if let Ok(value) = HeaderValue::from_str(&secs) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
    }
    response
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
            let served = match Inbound::current() {
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

/// Runs one idempotent request through samekey: claim, run the handler once, store (or not) and answer;
/// or replay, or refuse.
async fn serve<S, ReqBody, ResBody>(
    mut inner: S,
    request: Request<ReqBody>,
    config: Arc<Config>,
    key: KeyBuilder,
    verify: KeyBuilder,
) -> Result<Response<ResBody>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes> + From<Bytes>,
    ResBody::Error: Into<BoxError>,
{
    let failed: Mutex<Option<S::Error>> = Mutex::new(None);
    let unbuffered: Mutex<Option<Response<ResBody>>> = Mutex::new(None);
    let handle = async {
        match inner.call(request).await {
            Ok(response) => match Unbuffered::of(&response, config.max_body) {
                None => keep(response, &config).await,
                Some(why) => {
                    let status = response.status();
                    *unbuffered.lock().unwrap_or_else(|p| p.into_inner()) = Some(response);
                    if (config.store_when)(status) {
                        Ok(why.not_replayable(status, config.max_body))
                    } else {
                        Err(Refusal::Unbuffered(status))
                    }
                }
            },
            Err(e) => {
                *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                Err(Refusal::ServiceFailed)
            }
        }
    };
    let drive = once::run(config.runtime.as_ref(), config.spec(), key, verify, || {
        handle
    });
    let (out, report) = observed(drive).await;
    if let Some(e) = failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(e);
    }
    // The handler ran and answered with a stream or a body over the limit: it goes to this client as
    // it is, whatever was recorded.
    if let Some(response) = unbuffered.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Ok(response);
    }
    let replayed = report.is_some_and(|r| r.answer() == CallAnswer::Replayed);
    let stored = match out {
        Ok(stored) => stored,
        Err(Refusal::NotStored(stored)) => stored,
        Err(Refusal::Samekey(e)) => return Ok(refused(&e, config.retry_after)),
        Err(Refusal::ServiceFailed | Refusal::Unbuffered(_)) => {
            return Ok(Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "handler-failed",
                "Handler failed",
                "the handler did not answer",
            )
            .response())
        }
    };
    let mut response = match stored.response() {
        Ok(response) => response,
        Err(problem) => return Ok(problem.response()),
    };
    if replayed {
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// Why a handler's response is passed to its client as it is, not buffered and stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unbuffered {
    /// A stream: its body's `size_hint` has no upper bound (`Body::from_stream`, SSE).
    Stream,
    /// A body that may be over the limit: its `size_hint`'s upper bound is.
    TooLarge,
}

impl Unbuffered {
    /// Whether `response` is passed through unbuffered, and why; `None` for a body that fits the
    /// limit (whose `size_hint` says so).
    fn of<B: Body>(response: &Response<B>, max_body: usize) -> Option<Unbuffered> {
        match response.body().size_hint().upper() {
            None => Some(Unbuffered::Stream),
            Some(upper) if upper > u64::try_from(max_body).unwrap_or(u64::MAX) => {
                Some(Unbuffered::TooLarge)
            }
            Some(_) => None,
        }
    }

    /// What is stored for a key whose first request was answered unbuffered: a 409 that says so,
    /// with the first response's status (`first_status`) and no `Retry-After` (a retry cannot get that
    /// response again): `stream-not-replayable` for a stream, `response-not-replayable` (with
    /// `max_body`) for a body over the limit.
    fn not_replayable(self, status: StatusCode, max_body: usize) -> StoredResponse {
        let problem = match self {
            Unbuffered::Stream => Problem::new(
                StatusCode::CONFLICT,
                "stream-not-replayable",
                "Streamed response not replayable",
                format!(
                    "the first request with this Idempotency-Key was answered with a stream (status {}), which is not stored and cannot be replayed; the request is not run again for this key: use a new key to run it again",
                    status.as_u16()
                ),
            ),
            Unbuffered::TooLarge => Problem::new(
                StatusCode::CONFLICT,
                "response-not-replayable",
                "Response not replayable",
                format!(
                    "the first request with this Idempotency-Key was answered (status {}) with a body over {max_body} bytes, too large to store and replay; it took effect, and is not run again for this key: use a new key to run it again",
                    status.as_u16()
                ),
            )
            .with("max_body", max_body),
        }
        .with("first_status", status.as_u16());
        let response: Response<Bytes> = problem.response();
        let (parts, body) = response.into_parts();
        StoredResponse::keep(&parts, &body)
    }
}

/// Buffers a handler's response, whose `size_hint` says it fits the limit, and sorts it by the
/// storage policy. A body that cannot be read (it fails, or runs past the size its hint promised) is
/// lost to its client too: a 500 problem (`response-unreadable`) is stored and answered in its place.
async fn keep<B>(response: Response<B>, config: &Config) -> Result<StoredResponse, Refusal>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let (parts, body) = response.into_parts();
    let stored = match Limited::new(body, config.max_body).collect().await {
        Ok(collected) => StoredResponse::keep(&parts, &collected.to_bytes()),
        Err(e) => {
            let past_its_hint = e
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some();
            let why = if past_its_hint {
                format!(
                    "its body ran past the size it announced, over {} bytes",
                    config.max_body
                )
            } else {
                e.to_string()
            };
            let problem = Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "response-unreadable",
                "Response not stored",
                format!("the response to this request could not be read ({why}); it is not run again for this Idempotency-Key"),
            );
            let response: Response<Bytes> = problem.response();
            let (parts, body) = response.into_parts();
            // Stored in the response's place: the handler ran, a retry must not run it again.
            return Ok(StoredResponse::keep(&parts, &body));
        }
    };
    if (config.store_when)(parts.status) {
        Ok(stored)
    } else {
        Err(Refusal::NotStored(stored))
    }
}
