//! One idempotent request through samekey: claim its key, run the handler once, store its response
//! (or not, by the storage policy) and answer; or replay the stored response, or refuse — each
//! refusal an RFC 9457 problem.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use samekey_runtime::{
    key::KeyBuilder, observe::observed, observe::CallAnswer, Classify, Error, ErrorClass,
};
use tower_service::Service;

use super::stored::{StoredResponse, Unbuffered};
use super::{BoxError, Config};
use crate::headers::IDEMPOTENT_REPLAYED;
use crate::problem::Problem;

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

/// Runs one idempotent request through samekey: claim, run the handler once, store (or not) and answer;
/// or replay, or refuse.
pub(super) async fn serve<S, ReqBody, ResBody>(
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
    let drive = config
        .spec()
        .with_key(key)
        .verify_with(verify)
        .runtime_or_ambient(config.runtime.as_ref())
        .run_once(|| handle);
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
