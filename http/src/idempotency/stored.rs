//! What is stored for a key and replayed to a request that repeats it: the response (its status, the
//! headers that belong to it, its body), or, for a response passed to its client unbuffered (a
//! stream, a body over the limit), a 409 that says it cannot be replayed.

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode};
use http_body::Body;
use serde::{Deserialize, Serialize};

use crate::problem::Problem;

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
    pub(super) fn keep(parts: &http::response::Parts, body: &[u8]) -> StoredResponse {
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
    pub(super) fn response<B: From<Bytes>>(&self) -> Result<Response<B>, Problem> {
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

/// Why a handler's response is passed to its client as it is, not buffered and stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unbuffered {
    /// A stream: its body's `size_hint` has no upper bound (`Body::from_stream`, SSE).
    Stream,
    /// A body that may be over the limit: its `size_hint`'s upper bound is.
    TooLarge,
}

impl Unbuffered {
    /// Whether `response` is passed through unbuffered, and why; `None` for a body that fits the
    /// limit (whose `size_hint` says so).
    pub(super) fn of<B: Body>(response: &Response<B>, max_body: usize) -> Option<Unbuffered> {
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
    pub(super) fn not_replayable(self, status: StatusCode, max_body: usize) -> StoredResponse {
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
