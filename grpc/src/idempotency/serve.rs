//! One idempotent unary call through samekey: claim its key, run the method once, store its reply (or
//! not, by the storage policy) and answer; or replay the stored reply, or refuse.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use samekey_runtime::{
    key::KeyBuilder, observe::observed, observe::CallAnswer, Classify, Error, ErrorClass,
};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};
use tower_service::Service;

use super::stored::{frames, StoredReply};
use super::{BoxError, Config, Keep};
use crate::metadata::RETRY_PUSHBACK_MS;
use crate::once;

/// Why the layer's call did not end with a reply to store.
#[derive(Debug)]
enum Refusal {
    /// A reply the policy gives the key back for: answered, not kept.
    GivenBack(StoredReply),
    /// A reply the policy holds the key for (it may have run): answered, not kept; the call is
    /// recorded `UNKNOWN`.
    Held(StoredReply),
    /// The inner service failed (its error is handed back as it is); its outcome is unknown.
    ServiceFailed,
    /// samekey's answer: key reused, in progress, unknown, the store failing.
    Samekey(Error),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::GivenBack(r) | Refusal::Held(r) => {
                write!(f, "a reply of status {:?} is not stored", r.code())
            }
            Refusal::ServiceFailed => f.write_str("the service failed"),
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
            Refusal::GivenBack(_) => ErrorClass::Rejected,
            Refusal::Held(_) | Refusal::ServiceFailed => ErrorClass::Unknown,
            Refusal::Samekey(e) => e.classify(),
        }
    }
}

/// Runs one idempotent call through samekey.
pub(super) async fn serve<S, ResBody>(
    mut inner: S,
    request: Request<tonic::body::Body>,
    config: Arc<Config>,
    key: KeyBuilder,
    verify: KeyBuilder,
) -> Result<Response<tonic::body::Body>, S::Error>
where
    S: Service<Request<tonic::body::Body>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes>,
    ResBody::Error: Into<BoxError>,
{
    let failed: Mutex<Option<S::Error>> = Mutex::new(None);
    // The first client's own reply when it is not stored (held, or streamed), answered as it is.
    let answered: Mutex<Option<StoredReply>> = Mutex::new(None);
    let handle = async {
        match inner.call(request).await {
            Ok(response) => {
                let (reply, unreadable) = keep(response, &config).await;
                if unreadable {
                    // The method ran and its reply is lost: what is kept in its place is stored,
                    // whatever the policy, so that a retry does not run it again.
                    return Ok(reply);
                }
                let code = reply.code();
                if reply.message().is_none() && frames_of(&reply) > 1 {
                    // A server stream: the first client gets all of it; a retry is refused.
                    *answered.lock().unwrap_or_else(|p| p.into_inner()) = Some(reply);
                    return Ok(StoredReply::of_status(super::streaming_refused(
                        "this method",
                        "its first reply was a stream of messages",
                    )));
                }
                match (config.store_when)(code) {
                    Keep::Store => Ok(reply),
                    Keep::GiveBack => Err(Refusal::GivenBack(reply)),
                    Keep::Hold => {
                        *answered.lock().unwrap_or_else(|p| p.into_inner()) = Some(reply.clone());
                        Err(Refusal::Held(reply))
                    }
                }
            }
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
    if let Some(reply) = answered.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Ok(reply.response(false).unwrap_or_else(|s| s.into_http()));
    }
    let replayed = report.is_some_and(|r| r.answer() == CallAnswer::Replayed);
    let reply = match out {
        Ok(reply) | Err(Refusal::GivenBack(reply)) | Err(Refusal::Held(reply)) => reply,
        Err(Refusal::Samekey(e)) => return Ok(refused(&e, config.retry_after).into_http()),
        Err(Refusal::ServiceFailed) => {
            return Ok(Status::unknown("the method did not answer").into_http())
        }
    };
    Ok(reply.response(replayed).unwrap_or_else(|s| s.into_http()))
}

fn frames_of(reply: &StoredReply) -> usize {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(&reply.body)
        .ok()
        .and_then(|body| frames(&body))
        .unwrap_or(0)
}

/// Buffers a method's reply (up to the limit). A reply that cannot be read, or is over the limit, is
/// lost to its client too: an `INTERNAL` is kept in its place, flagged `true` (the method ran; it is
/// stored and never run again).
async fn keep<B>(response: Response<B>, config: &Config) -> (StoredReply, bool)
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let (parts, body) = response.into_parts();
    match Limited::new(body, config.max_message).collect().await {
        Ok(collected) => {
            let trailers = collected.trailers().cloned();
            let reply = StoredReply::keep(&parts.headers, &collected.to_bytes(), trailers.as_ref());
            (reply, false)
        }
        Err(e) => {
            let why = if e
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                format!("it is over {} bytes", config.max_message)
            } else {
                e.to_string()
            };
            let reply = StoredReply::of_status(Status::internal(format!(
                "the reply to this call could not be read ({why}); it is not run again for this idempotency-key"
            )));
            (reply, true)
        }
    }
}

/// A status that asks the client to come back after `after`: `google.rpc.RetryInfo` in its details
/// and gRFC A6's `grpc-retry-pushback-ms`.
fn come_back(code: Code, message: String, after: Duration) -> Status {
    let mut status =
        Status::with_error_details(code, message, ErrorDetails::with_retry_info(Some(after)));
    if let Ok(value) = after.as_millis().to_string().parse() {
        status.metadata_mut().insert(RETRY_PUSHBACK_MS, value);
    }
    status
}

/// The answer to a refusal by samekey.
fn refused(error: &Error, retry_after: Duration) -> Status {
    match error {
        Error::KeyReuse { .. } => Status::failed_precondition(
            "this idempotency-key was used with another request message: use a new key for a new request",
        ),
        Error::InProgress { .. } => come_back(
            Code::Aborted,
            "a call with this idempotency-key is still being processed: retry after the delay to get its reply".into(),
            retry_after,
        ),
        Error::Unknown { call_id } => come_back(
            Code::Aborted,
            format!("the call first made with this idempotency-key (call {call_id}) ended without a reply that could be stored, and whether it took effect is not known; it is not run again, and is queued for resolution"),
            retry_after,
        ),
        Error::Overloaded { .. } => come_back(
            Code::ResourceExhausted,
            format!("the call was not run: {error}"),
            retry_after,
        ),
        Error::Store(e) => Status::unavailable(format!(
            "the call was not run: its idempotency-key cannot be checked now ({e})"
        )),
        other => Status::internal(other.to_string()),
    }
}
