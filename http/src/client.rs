//! The client side (feature `reqwest`): a reqwest middleware that carries the call's identity on every
//! attempt, the classification of reqwest's results, and a receipt lookup.

use std::sync::Arc;
use std::time::Duration;

use http::{Extensions, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use reqwest_middleware::{Middleware, Next};
use samekey_runtime::{context::Context, Classify, Error, ErrorClass, RemoteStatus, TraceParent};
use serde::de::DeserializeOwned;

use crate::headers::{IDEMPOTENCY_KEY, TRACEPARENT, X_ATTEMPT, X_CALL_ID, X_TRACE_ID};
use crate::receipt::ReceiptAnswer;

type KeyOf = Arc<dyn Fn(&Context) -> String + Send + Sync>;

/// A reqwest middleware: inside an `#[idempotent]` call, every request carries the call's identity —
/// `X-Call-Id`, `X-Trace-Id`, the W3C `traceparent` ([`Context::traceparent`]: the call's traceId as
/// its trace-id), `Idempotency-Key` (the callId, or what [`key`](CallHeaders::key) maps the call to)
/// the same on every attempt, and `X-Attempt` (1, 2, …, as gRPC's `grpc-previous-rpc-attempts`) — so
/// that the remote side dedups the attempts and an operator can correlate them. Headers the request
/// already has are left as they are.
///
/// Outside a call but inside an [`InboundCall`](samekey_runtime::context::InboundCall) scope (a
/// handler under [`CallContextLayer`](crate::CallContextLayer) that calls on without
/// `#[idempotent]`), it sends the trace only: `traceparent`
/// ([`outbound_traceparent`](samekey_runtime::context::outbound_traceparent)) and `X-Trace-Id`.
/// Outside both it adds nothing.
///
/// ```
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(samekey_http::CallHeaders::new())
///     .build();
/// # let _ = client;
/// ```
#[derive(Clone, Default)]
pub struct CallHeaders {
    key: Option<KeyOf>,
}

impl std::fmt::Debug for CallHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallHeaders").finish_non_exhaustive()
    }
}

impl CallHeaders {
    /// The middleware, with the callId as `Idempotency-Key`.
    pub fn new() -> CallHeaders {
        CallHeaders::default()
    }

    /// Maps a call to the `Idempotency-Key` it sends (e.g. the key's digest, or a business id), instead
    /// of its callId. It is called for every attempt: make it depend on the call only.
    pub fn key(mut self, key: impl Fn(&Context) -> String + Send + Sync + 'static) -> CallHeaders {
        self.key = Some(Arc::new(key));
        self
    }

    /// Sets the headers of `cx` on `headers`, leaving the ones already there.
    fn stamp(&self, cx: &Context, headers: &mut HeaderMap) {
        let key = match &self.key {
            Some(key) => key(cx),
            None => cx.call_id().to_string(),
        };
        let values = [
            (X_CALL_ID, cx.call_id().to_string()),
            (X_TRACE_ID, cx.trace_id().to_string()),
            (TRACEPARENT, cx.traceparent().to_string()),
            (IDEMPOTENCY_KEY, sf_string(&key)),
        ];
        insert_missing(headers, values);
        headers.insert(X_ATTEMPT, HeaderValue::from(cx.attempt()));
    }
}

/// Sets the trace of a request sent outside a call (in an inbound scope), leaving the headers there.
fn stamp_trace(tp: TraceParent, headers: &mut HeaderMap) {
    let values = [
        (X_TRACE_ID, tp.trace_id().to_string()),
        (TRACEPARENT, tp.to_string()),
    ];
    insert_missing(headers, values);
}

/// Inserts each header `headers` does not have yet.
fn insert_missing<const N: usize>(headers: &mut HeaderMap, values: [(HeaderName, String); N]) {
    for (name, value) in values {
        if !headers.contains_key(&name) {
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.insert(name, value);
            }
        }
    }
}

/// `text` as a structured-field string: quoted, `"` and `\` escaped (characters outside printable
/// ASCII are dropped: an sf-string cannot carry them).
fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[async_trait::async_trait]
impl Middleware for CallHeaders {
    async fn handle(
        &self,
        mut request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        if let Some(cx) = samekey_runtime::context::try_current() {
            self.stamp(&cx, request.headers_mut());
        } else if let Some(tp) = samekey_runtime::context::outbound_traceparent() {
            stamp_trace(tp, request.headers_mut());
        }
        next.run(request, extensions).await
    }
}

/// The class of a reqwest error (no response): a connection that never opened (refused, DNS, a
/// connect timeout) sent nothing — `Retryable`; a timeout or a reset after the request went out may
/// have reached the remote side — `Unknown`; a request that could not be built — `Permanent`.
pub fn classify_transport(error: &reqwest::Error) -> ErrorClass {
    if error.is_builder() {
        ErrorClass::Permanent
    } else if error.is_connect() {
        ErrorClass::Retryable
    } else {
        ErrorClass::Unknown
    }
}

/// The class of a response's status (`None` for a success): 408, 425, 429, and 503 or 409 with
/// `Retry-After`, are `RateLimited` with the wait they ask for; other 4xx are `Permanent`; other 5xx
/// are `Retryable` for idempotent methods (`GET`, `PUT`, `DELETE`, …: sending it again changes
/// nothing) and `Unknown` for the others (a `POST` may have taken effect before the error).
///
/// A 409 is the Idempotency-Key draft's answer to a request whose key is still in flight. The draft
/// says nothing of `Retry-After`; the [`IdempotencyLayer`](crate::IdempotencyLayer) adds it to the
/// 409s a later retry may get past (the first request still running; its outcome unknown, queued for
/// resolution), so a 409 with `Retry-After` is "come back later" — a retry after the wait gets the
/// first request's response. A 409 without one (a conflict, a key whose first response was a stream)
/// is `Permanent`.
///
/// The default of [`send`]; pass your own to [`send_with`], falling back on this one.
pub fn classify_status(
    method: &Method,
    status: StatusCode,
    headers: &HeaderMap,
) -> Option<ErrorClass> {
    if status.is_success() || status.is_informational() || status.is_redirection() {
        return None;
    }
    let retry_after = retry_after(headers);
    Some(match status.as_u16() {
        408 | 425 | 429 => ErrorClass::RateLimited { retry_after },
        // 503, and an Idempotency-Key layer's "request in progress", with a time to come back.
        409 | 503 if retry_after.is_some() => ErrorClass::RateLimited { retry_after },
        400..=499 => ErrorClass::Permanent,
        _ if method.is_idempotent() => ErrorClass::Retryable,
        _ => ErrorClass::Unknown,
    })
}

/// `Retry-After` in seconds (an HTTP date is not read: `None`).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
        .map(Duration::from_secs)
}

/// A failed HTTP call, classified (see [`classify_transport`] and [`classify_status`]): usable as the
/// error type of an `#[idempotent]` function that calls another service. Its failures are stored by
/// their message.
#[derive(Debug)]
pub enum RemoteError {
    /// No response: the transport failed.
    Transport(reqwest_middleware::Error),
    /// A response that is not a success.
    Status {
        /// The request's method.
        method: Method,
        /// The status.
        status: StatusCode,
        /// Its class.
        class: ErrorClass,
        /// The body, as text (the first 1 000 characters).
        body: String,
    },
    /// The remote side's receipt says the call failed there, for good (a lookup's answer).
    Refused(String),
    /// samekey's own answer (a duplicate in progress, an unknown outcome, the store failing).
    Samekey(Error),
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoteError::Transport(e) => write!(f, "request failed: {e}"),
            RemoteError::Status {
                method,
                status,
                body,
                ..
            } => write!(f, "{method} answered {status}: {body}"),
            RemoteError::Refused(message) => write!(f, "refused by the remote side: {message}"),
            RemoteError::Samekey(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for RemoteError {}

impl From<Error> for RemoteError {
    fn from(e: Error) -> RemoteError {
        RemoteError::Samekey(e)
    }
}

impl From<reqwest_middleware::Error> for RemoteError {
    fn from(e: reqwest_middleware::Error) -> RemoteError {
        RemoteError::Transport(e)
    }
}

impl From<reqwest::Error> for RemoteError {
    fn from(e: reqwest::Error) -> RemoteError {
        RemoteError::Transport(reqwest_middleware::Error::Reqwest(e))
    }
}

impl Classify for RemoteError {
    fn classify(&self) -> ErrorClass {
        match self {
            RemoteError::Transport(reqwest_middleware::Error::Reqwest(e)) => classify_transport(e),
            // A middleware's own failure: whether the request went out is not known.
            RemoteError::Transport(_) => ErrorClass::Unknown,
            RemoteError::Status { class, .. } => *class,
            RemoteError::Refused(_) => ErrorClass::Permanent,
            RemoteError::Samekey(e) => e.classify(),
        }
    }
}

/// Sends `request` and turns a response that is not a success into [`RemoteError::Status`] (with its
/// class and body), by [`classify_status`].
pub async fn send(
    request: reqwest_middleware::RequestBuilder,
) -> Result<reqwest::Response, RemoteError> {
    send_with(request, classify_status).await
}

/// [`send`] with your own classification of a response: `classify` returns `None` for a response to
/// hand back as a success, else the class of the [`RemoteError::Status`] it becomes. Decide the
/// statuses that mean something else for this remote and leave the rest to [`classify_status`]:
///
/// ```no_run
/// # use samekey_http::{classify_status, send_with, RemoteError};
/// # use samekey_runtime::ErrorClass;
/// # async fn demo(client: reqwest_middleware::ClientWithMiddleware) -> Result<(), RemoteError> {
/// let request = client.delete("http://127.0.0.1:8081/holds/7");
/// let response = send_with(request, |method, status, headers| match status.as_u16() {
///     // Already gone: what the DELETE wanted.
///     404 => None,
///     // This remote's "card declined": sending it again will not help.
///     402 => Some(ErrorClass::Permanent),
///     _ => classify_status(method, status, headers),
/// })
/// .await?;
/// # let _ = response; Ok(()) }
/// ```
///
/// Failures without a response are classified by [`classify_transport`] either way.
pub async fn send_with(
    request: reqwest_middleware::RequestBuilder,
    classify: impl FnOnce(&Method, StatusCode, &HeaderMap) -> Option<ErrorClass>,
) -> Result<reqwest::Response, RemoteError> {
    let (client, built) = request.build_split();
    let request = built?;
    let method = request.method().clone();
    let response = client.execute(request).await?;
    match classify(&method, response.status(), response.headers()) {
        None => Ok(response),
        Some(class) => {
            let status = response.status();
            let mut body = response.text().await.unwrap_or_default();
            if let Some((cut, _)) = body.char_indices().nth(1_000) {
                body.truncate(cut);
            }
            Err(RemoteError::Status {
                method,
                status,
                class,
                body,
            })
        }
    }
}

/// Asks a receipt endpoint about a callId: `GET url`, a [`ReceiptAnswer`] in JSON (a 404 is
/// `NotReceived`), as the `RemoteStatus` a `lookup = …` answers (a failure there as
/// [`RemoteError::Refused`]).
///
/// ```no_run
/// # use samekey_http::{lookup_receipt, RemoteError};
/// # async fn demo(client: reqwest_middleware::ClientWithMiddleware, call: &samekey_runtime::CallId) -> Result<(), RemoteError> {
/// let status = lookup_receipt::<u64>(&client, format!("http://127.0.0.1:8080/receipts/{call}")).await?;
/// # let _ = status; Ok(()) }
/// ```
pub async fn lookup_receipt<T: DeserializeOwned>(
    client: &reqwest_middleware::ClientWithMiddleware,
    url: impl reqwest::IntoUrl,
) -> Result<RemoteStatus<T, RemoteError>, RemoteError> {
    let response = client.get(url).send().await?;
    if response.status() == StatusCode::NOT_FOUND {
        return Ok(RemoteStatus::NotReceived);
    }
    let method = Method::GET;
    if let Some(class) = classify_status(&method, response.status(), response.headers()) {
        let status = response.status();
        return Err(RemoteError::Status {
            method,
            status,
            class,
            body: response.text().await.unwrap_or_default(),
        });
    }
    let answer: ReceiptAnswer<T> = response.json().await?;
    Ok(match answer {
        ReceiptAnswer::Succeeded { value } => RemoteStatus::Succeeded(value),
        ReceiptAnswer::Failed { error } => RemoteStatus::Failed(RemoteError::Refused(error)),
        ReceiptAnswer::Processing => RemoteStatus::Processing,
        ReceiptAnswer::NotReceived => RemoteStatus::NotReceived,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified() {
        let none = HeaderMap::new();
        let mut later = HeaderMap::new();
        later.insert(http::header::RETRY_AFTER, HeaderValue::from_static("7"));
        let wait = Some(Duration::from_secs(7));
        let post = Method::POST;
        assert_eq!(classify_status(&post, StatusCode::CREATED, &none), None);
        assert_eq!(
            classify_status(&post, StatusCode::TOO_MANY_REQUESTS, &later),
            Some(ErrorClass::RateLimited { retry_after: wait })
        );
        assert_eq!(
            classify_status(&post, StatusCode::SERVICE_UNAVAILABLE, &later),
            Some(ErrorClass::RateLimited { retry_after: wait })
        );
        assert_eq!(
            classify_status(&post, StatusCode::CONFLICT, &none),
            Some(ErrorClass::Permanent)
        );
        assert_eq!(
            classify_status(&post, StatusCode::BAD_GATEWAY, &none),
            Some(ErrorClass::Unknown)
        );
        assert_eq!(
            classify_status(&Method::PUT, StatusCode::BAD_GATEWAY, &none),
            Some(ErrorClass::Retryable)
        );
        assert_eq!(
            classify_status(&post, StatusCode::REQUEST_TIMEOUT, &none),
            Some(ErrorClass::RateLimited { retry_after: None })
        );
    }

    #[test]
    fn keys_are_sf_strings() {
        assert_eq!(sf_string("pay-1-ab-n1"), "\"pay-1-ab-n1\"");
        assert_eq!(sf_string("a\"b\\c\u{e9}"), "\"a\\\"b\\\\c\"");
    }
}
