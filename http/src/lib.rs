//! samekey across the wire: the callId and traceId of a logical call over HTTP, and the
//! `Idempotency-Key` header on samekey's receipts.
//!
//! * [`CallContextLayer`] (tower, for axum and any tower server): adopts `X-Call-Id` and
//!   `X-Trace-Id` into samekey's context for the handler, validates them (400, RFC 9457), fills and
//!   marks a missing callId in gateway mode, echoes both on the response.
//! * [`IdempotencyLayer`]: the IETF httpapi draft "The Idempotency-Key HTTP Header Field" (draft-07)
//!   — 400 / 409 / 413 / 422, stored responses replayed with `Idempotent-Replayed: true` — on any
//!   samekey store.
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

mod context;
pub mod headers;
mod idempotency;
mod problem;

pub use context::{CallContext, CallContextLayer, CallIdSource, RequestIds};
pub use idempotency::{
    store_2xx_and_4xx, Idempotency, IdempotencyLayer, StoredResponse, MAX_KEY_LEN,
};
pub use problem::Problem;
