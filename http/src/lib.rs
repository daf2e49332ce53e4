//! samekey across the wire: the callId and traceId of a logical call over HTTP, and the
//! `Idempotency-Key` header on samekey's receipts.
//!
//! * [`CallContextLayer`] (tower, for axum and any tower server): adopts `X-Call-Id` and
//!   `X-Trace-Id` into samekey's context for the handler, validates them (400, RFC 9457), fills and
//!   marks a missing callId in gateway mode, echoes both on the response; adopts a W3C `traceparent`
//!   too (its trace-id is the traceId; a malformed one is ignored) and passes it on.
//! * [`IdempotencyLayer`]: the IETF httpapi draft "The Idempotency-Key HTTP Header Field" (draft-07)
//!   — 400 / 409 / 413 / 422, stored responses replayed with `Idempotent-Replayed: true` — on any
//!   samekey store.
//! * [`CallHeaders`] (feature `reqwest`): a reqwest middleware that sends the call's `X-Call-Id`,
//!   `X-Trace-Id`, `traceparent`, `Idempotency-Key` and `X-Attempt` on every attempt; [`RemoteError`] and
//!   [`send`] classify reqwest's results for the retry loop ([`send_with`] with your own
//!   classification); [`lookup_receipt`] asks a service's
//!   receipt endpoint.
//!
//! Messages (the envelope that carries a call's ids in a message, the consumer's inbox, brokers and
//! the outbox) are in `samekey-messaging`.
//!
//! Feature `opentelemetry`: the `samekey` span of [`CallContextLayer`] is a child of the active
//! OpenTelemetry span, else of the inbound `traceparent`'s remote span, and the `traceparent` sent
//! names the active span (see `samekey_runtime::context::parent_span`).
//!
//! ```
//! use axum::{routing::post, Router};
//! use samekey_http::{CallContextLayer, IdempotencyLayer};
//!
//! async fn create_order() -> &'static str {
//!     "created"
//! }
//!
//! let app: Router = Router::new()
//!     .route("/orders", post(create_order))
//!     .layer(IdempotencyLayer::new())
//!     .layer(CallContextLayer::new());
//! # let _ = app;
//! ```

#![warn(missing_docs)]

#[cfg(feature = "reqwest")]
mod client;
mod context;
pub mod headers;
mod idempotency;
mod problem;
mod receipt;

#[cfg(feature = "reqwest")]
pub use client::{
    classify_status, classify_transport, lookup_receipt, send, send_with, CallHeaders, RemoteError,
};
pub use context::{CallContext, CallContextLayer, CallIdSource, RequestIds};
pub use idempotency::{
    store_2xx_and_4xx, Idempotency, IdempotencyLayer, StoredResponse, MAX_KEY_LEN,
};
pub use problem::Problem;
#[cfg(feature = "axum")]
pub use receipt::receipts;
pub use receipt::ReceiptAnswer;
