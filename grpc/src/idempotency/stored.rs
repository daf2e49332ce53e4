//! What is stored for a key and replayed to a call that repeats it: the reply's metadata, its message
//! frames, its status and the trailing metadata that belongs to it.

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response};
use serde::{Deserialize, Serialize};
use tonic::{Code, Status};

use crate::metadata::{IDEMPOTENT_REPLAYED, X_CALL_ID, X_CALL_ID_SOURCE, X_TRACE_ID};

/// A unary reply as the store keeps it: its initial metadata, its body (the length-prefixed message
/// frame as sent), its trailing metadata (`grpc-status` and `grpc-message` among them). A
/// trailers-only reply (a status without a message) keeps its metadata in `headers` and no trailers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredReply {
    /// The reply's gRPC status code.
    pub code: i32,
    /// Its initial metadata (base64 values), but the connection's and the call's own ids.
    pub headers: Vec<(String, String)>,
    /// The body as sent (gRPC frames), base64.
    pub body: String,
    /// Its trailing metadata (base64 values); empty for a trailers-only reply.
    pub trailers: Vec<(String, String)>,
}

/// Entries that belong to the call, not to the reply: the replay's request brings its own.
fn kept(name: &HeaderName) -> bool {
    !matches!(
        name.as_str(),
        X_CALL_ID | X_TRACE_ID | X_CALL_ID_SOURCE | "date" | "content-length" | "traceparent"
    )
}

fn encode(map: &HeaderMap) -> Vec<(String, String)> {
    map.iter()
        .filter(|(name, _)| kept(name))
        .map(|(name, value)| {
            (
                name.to_string(),
                base64::engine::general_purpose::STANDARD.encode(value.as_bytes()),
            )
        })
        .collect()
}

fn decode(entries: &[(String, String)]) -> Result<HeaderMap, Status> {
    let corrupt =
        || Status::internal("the reply stored for this idempotency-key cannot be read back");
    let mut map = HeaderMap::with_capacity(entries.len());
    for (name, value) in entries {
        let name = HeaderName::try_from(name.as_str()).map_err(|_| corrupt())?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(value)
            .map_err(|_| corrupt())?;
        let value = HeaderValue::from_bytes(&bytes).map_err(|_| corrupt())?;
        map.append(name, value);
    }
    Ok(map)
}

/// The gRPC status code of a reply: its trailers', else (trailers-only) its headers'; a reply with
/// neither is `UNKNOWN`, as gRPC clients read it.
pub(crate) fn code_of(headers: &HeaderMap, trailers: Option<&HeaderMap>) -> Code {
    trailers
        .and_then(|t| t.get("grpc-status"))
        .or_else(|| headers.get("grpc-status"))
        .map(|v| Code::from_bytes(v.as_bytes()))
        .unwrap_or(Code::Unknown)
}

/// How many length-prefixed gRPC messages `body` holds (`None` when it is not a whole number of them).
pub(crate) fn frames(body: &[u8]) -> Option<usize> {
    let mut rest = body;
    let mut count = 0;
    while !rest.is_empty() {
        if rest.len() < 5 {
            return None;
        }
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        rest = rest.get(5 + len..)?;
        count += 1;
    }
    Some(count)
}

impl StoredReply {
    /// Keeps a reply.
    pub(crate) fn keep(
        headers: &HeaderMap,
        body: &[u8],
        trailers: Option<&HeaderMap>,
    ) -> StoredReply {
        StoredReply {
            code: code_of(headers, trailers) as i32,
            headers: encode(headers),
            body: base64::engine::general_purpose::STANDARD.encode(body),
            trailers: trailers.map(encode).unwrap_or_default(),
        }
    }

    /// A status as a stored reply (trailers-only).
    pub(crate) fn of_status(status: Status) -> StoredReply {
        let response: Response<tonic::body::Body> = status.into_http();
        StoredReply::keep(response.headers(), &[], None)
    }

    /// The reply's status code.
    pub fn code(&self) -> Code {
        Code::from(self.code)
    }

    /// The reply's message bytes (the protobuf of its one message, without the frame's prefix), for a
    /// reply that holds exactly one uncompressed message.
    pub fn message(&self) -> Option<Vec<u8>> {
        let body = base64::engine::general_purpose::STANDARD
            .decode(&self.body)
            .ok()?;
        if frames(&body) != Some(1) || body[0] != 0 {
            return None;
        }
        Some(body[5..].to_vec())
    }

    /// The reply's `grpc-message`, percent-decoded.
    pub fn status_message(&self) -> String {
        let entries = if self.trailers.is_empty() {
            &self.headers
        } else {
            &self.trailers
        };
        decode(entries)
            .ok()
            .and_then(|map| Status::from_header_map(&map))
            .map(|status| status.message().to_owned())
            .unwrap_or_default()
    }

    /// The reply again, marked `idempotent-replayed: true` when `replayed` (in its initial metadata,
    /// and in its trailers, where a client reads a failed call's metadata).
    pub(crate) fn response(&self, replayed: bool) -> Result<Response<tonic::body::Body>, Status> {
        let mut headers = decode(&self.headers)?;
        let body = base64::engine::general_purpose::STANDARD
            .decode(&self.body)
            .map_err(|_| {
                Status::internal("the reply stored for this idempotency-key cannot be read back")
            })?;
        let mut trailers = if self.trailers.is_empty() {
            None
        } else {
            Some(decode(&self.trailers)?)
        };
        if replayed {
            let yes = HeaderValue::from_static("true");
            headers.insert(IDEMPOTENT_REPLAYED, yes.clone());
            if let Some(trailers) = trailers.as_mut() {
                trailers.insert(IDEMPOTENT_REPLAYED, yes);
            }
        }
        let body = ReplayBody {
            data: Some(Bytes::from(body)).filter(|b| !b.is_empty()),
            trailers,
        };
        let mut response = Response::new(tonic::body::Body::new(body));
        *response.headers_mut() = headers;
        Ok(response)
    }
}

/// A stored reply's body: its data in one frame, then its trailers; its end known, so that the
/// transport closes the stream with the last frame.
struct ReplayBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl http_body::Body for ReplayBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let frame = match self.data.take() {
            Some(data) => Some(http_body::Frame::data(data)),
            None => self.trailers.take().map(http_body::Frame::trailers),
        };
        std::task::Poll::Ready(frame.map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}
