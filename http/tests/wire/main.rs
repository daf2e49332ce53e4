//! samekey across the wire, over real HTTP on loopback — one test binary.
//!
//! * [`server`]: the Idempotency-Key and call context layers (axum serving, reqwest asking), on the
//!   memory store and, with their features, on SQLite, PostgreSQL and Redis.
//! * [`client`]: the reqwest middleware, the classification of what comes back, the receipt lookup
//!   (feature `reqwest`).
//! * [`traceparent`]: W3C trace context over HTTP — adopted, passed on, ignored when malformed,
//!   winning over `X-Trace-Id` (feature `reqwest`).
//! * [`two_services_example`]: the `two_services` example's scenario, checked (features `axum`,
//!   `reqwest`; was `tests/two_services.rs`).
//!
//! Every server here listens on a port of its own (`127.0.0.1:0`). The call context in `tracing`
//! spans is checked by a binary of its own, `tracing`: its subscriber is set for its thread only, and
//! `tracing` caches each callsite's interest as the first thread to reach it found it, so the requests
//! of the tests beside it would switch its spans off.

mod client;
mod server;
mod traceparent;
mod two_services_example;
