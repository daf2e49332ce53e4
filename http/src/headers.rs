//! The header names samekey reads and writes.

use http::HeaderName;

/// The callId of the logical call a request belongs to (the same on every attempt).
pub const X_CALL_ID: HeaderName = HeaderName::from_static("x-call-id");
/// The traceId of the business chain a call belongs to.
pub const X_TRACE_ID: HeaderName = HeaderName::from_static("x-trace-id");
/// The W3C Trace Context `traceparent` (<https://www.w3.org/TR/trace-context/#traceparent-header>):
/// its trace-id is the traceId, and wins over `X-Trace-Id`.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// `gateway` when a gateway filled a missing callId (the caller sent none).
pub const X_CALL_ID_SOURCE: HeaderName = HeaderName::from_static("x-call-id-source");
/// The attempt number of a request within its logical call (1 for the first).
pub const X_ATTEMPT: HeaderName = HeaderName::from_static("x-attempt");
/// The IETF `Idempotency-Key` header (draft-ietf-httpapi-idempotency-key-header-07): an sf-string.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// `true` on a response replayed from the store instead of produced by the handler.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
