//! The metadata keys samekey reads and writes on gRPC calls.

/// The callId of the caller's logical call, the same on every attempt.
pub const X_CALL_ID: &str = "x-call-id";
/// The traceId every hop of a logical call carries (32 lowercase hex digits).
pub const X_TRACE_ID: &str = "x-trace-id";
/// The W3C trace context (`00-<trace-id>-<parent-id>-<flags>`), as OpenTelemetry propagates it.
pub const TRACEPARENT: &str = "traceparent";
/// `gateway` when the callId was filled by a gateway's [`CallContextLayer`](crate::CallContextLayer).
pub const X_CALL_ID_SOURCE: &str = "x-call-id-source";
/// The key a client gives a unary call's effect: the same on every retry.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// `true` on a reply the [`IdempotencyLayer`](crate::IdempotencyLayer) replayed from its store.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// gRFC A6: how many attempts of this call came before this one (absent on the first).
pub const GRPC_PREVIOUS_RPC_ATTEMPTS: &str = "grpc-previous-rpc-attempts";
pub use samekey_runtime::grpc_status::{ERROR_CLASS, IDEMPOTENCY_LEVEL, RETRY_PUSHBACK_MS};
