//! One idempotent unary call through samekey: claim its key, run the method once, store its reply (or
//! not, by the storage policy) and answer; or replay the stored reply, or refuse.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use samekey_runtime::{
    key::KeyBuilder, observe::observed, observe::CallAnswer, Classify, Error, ErrorClass,
};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};
use tower_service::Service;

use super::stored::{frames, StoredReply};
use super::{BoxError, Config, Keep};
use crate::metadata::{ERROR_CLASS, RETRY_PUSHBACK_MS};

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
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let failed: Mutex<Option<S::Error>> = Mutex::new(None);
    // The first client's own reply when it is not stored (held), answered as it is.
    let answered: Mutex<Option<StoredReply>> = Mutex::new(None);
    // A reply passed to its client as it comes (a stream, or over the limit).
    let passed: Mutex<Option<Response<tonic::body::Body>>> = Mutex::new(None);
    let handle = async {
        match inner.call(request).await {
            Ok(response) => {
                let reply = match keep(response, &config).await {
                    Kept::Reply(reply) => reply,
                    // The method ran and its reply is lost: what is kept in its place is stored,
                    // whatever the policy, so that a retry does not run it again.
                    Kept::Unreadable(reply) => return Ok(reply),
                    // A stream, or a reply over the limit: it goes to its first client as it comes,
                    // and the key is settled with a refusal, so that a retry never runs it again.
                    Kept::Passed(response, why) => {
                        *passed.lock().unwrap_or_else(|p| p.into_inner()) = Some(response);
                        return Ok(StoredReply::of_status(super::streaming_refused(
                            "this method",
                            why,
                        )));
                    }
                };
                let code = reply.code();
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
    if let Some(response) = passed.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Ok(response);
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

/// How long the layer waits, after a reply's first whole message, for its end before it takes the
/// reply for a stream: a unary reply's trailers follow its message at once.
const STREAM_GRACE: Duration = Duration::from_millis(100);

/// A method's reply, as [`keep`] found it.
enum Kept {
    /// A unary reply, buffered whole.
    Reply(StoredReply),
    /// A reply that failed to be read: an `INTERNAL` in its place.
    Unreadable(StoredReply),
    /// A stream (a second message, or no end after the first) or a reply over the limit: the
    /// response to hand its client, what was read so far in front of the rest.
    Passed(Response<tonic::body::Body>, &'static str),
}

/// Buffers a method's reply, up to the limit and while it looks unary (one message, then its end).
async fn keep<B>(response: Response<B>, config: &Config) -> Kept
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (parts, body) = response.into_parts();
    let mut body = Box::pin(body);
    let mut data = bytes::BytesMut::new();
    let mut trailers = None;
    let pass = |parts: http::response::Parts, data: bytes::BytesMut, rest, why| {
        let body = PrefixedBody {
            prefix: Some(data.freeze()).filter(|d| !d.is_empty()),
            rest,
        };
        Kept::Passed(
            Response::from_parts(parts, tonic::body::Body::new(body)),
            why,
        )
    };
    loop {
        let next = if frames(&data) == Some(1) {
            match tokio::time::timeout(STREAM_GRACE, body.frame()).await {
                Ok(next) => next,
                Err(_) => {
                    return pass(
                        parts,
                        data,
                        body,
                        "its reply is a stream (no end after its first message)",
                    )
                }
            }
        } else {
            body.frame().await
        };
        match next {
            None => break,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(chunk) => {
                    data.extend_from_slice(&chunk);
                    if data.len() > config.max_message {
                        return pass(
                            parts,
                            data,
                            body,
                            "its reply is over the size the layer stores",
                        );
                    }
                    if second_message_started(&data) {
                        return pass(parts, data, body, "its reply is a stream of messages");
                    }
                }
                Err(frame) => {
                    if let Ok(t) = frame.into_trailers() {
                        trailers = Some(t);
                    }
                }
            },
            Some(Err(e)) => {
                let e: BoxError = e.into();
                let reply = StoredReply::of_status(Status::internal(format!(
                    "the reply to this call could not be read ({e}); it is not run again for this idempotency-key"
                )));
                return Kept::Unreadable(reply);
            }
        }
    }
    Kept::Reply(StoredReply::keep(&parts.headers, &data, trailers.as_ref()))
}

/// Whether `data` holds more than its first gRPC message.
fn second_message_started(data: &[u8]) -> bool {
    if data.len() < 5 {
        return false;
    }
    let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
    data.len() > 5 + len
}

/// What was read of a reply, then the rest of it as it comes.
struct PrefixedBody<B> {
    prefix: Option<Bytes>,
    rest: std::pin::Pin<Box<B>>,
}

impl<B> Body for PrefixedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        if let Some(prefix) = self.prefix.take() {
            return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(prefix))));
        }
        self.rest
            .as_mut()
            .poll_frame(cx)
            .map(|frame| frame.map(|f| f.map_err(Into::into)))
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
        Error::Unknown { call_id } => {
            let mut status = come_back(
                Code::Aborted,
                format!("the call first made with this idempotency-key (call {call_id}) ended without a reply that could be stored, and whether it took effect is not known; it is not run again, and is queued for resolution"),
                retry_after,
            );
            // Come back later, but never read as "not run": the call may have taken effect.
            status.metadata_mut().insert(
                ERROR_CLASS,
                tonic::metadata::MetadataValue::from_static("unknown"),
            );
            status
        }
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
