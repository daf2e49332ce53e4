//! samekey over gRPC (tonic): the callId and traceId of a logical call in gRPC metadata, unary methods
//! made idempotent by their `idempotency-key`, a client layer that carries one identity over every
//! attempt, the classification of gRPC statuses, and a receipt service.
//!
//! * [`CallContextLayer`] (server): adopts `x-call-id` and `x-trace-id` into samekey's context,
//!   validates them (`INVALID_ARGUMENT`), fills and marks a missing callId in gateway mode, echoes
//!   both in the reply's metadata.
//! * [`IdempotencyLayer`] (server): the `idempotency-key` semantics of samekey-http's layer in gRPC
//!   terms — stored replies replayed with `idempotent-replayed: true`, `FAILED_PRECONDITION` for a key
//!   reused with another request, `ABORTED` with retry info for a key in flight, streaming refused.
//! * [`receipts`] (server): `samekey.v1.Receipts/Get`, what the service knows of a callId.
//! * [`CallMetadataLayer`] (client): `x-call-id`, `x-trace-id`, `idempotency-key` once per logical
//!   call, `grpc-previous-rpc-attempts` on retries; a method's `idempotency_level` marked on its
//!   failures so that `tonic::Status`'s [`Classify`](samekey_runtime::Classify) may resend it.
//! * [`lookup_receipt`] (client): asks a service's receipt service, as an `#[idempotent]` `lookup`.
//!
//! `tonic::Status` implements samekey's `Classify` and `From<samekey::Error>` (in samekey-runtime,
//! feature `tonic`, which this crate turns on): see [`classify_code`] for the table.

#![warn(missing_docs)]

mod client;
mod context;
mod idempotency;
pub mod metadata;
mod methods;
mod receipts;

/// The generated code of `samekey.v1` (`proto/samekey/v1/receipts.proto`): the receipt service's
/// messages, client and server.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!("generated/samekey.v1.rs");

    /// The encoded `FileDescriptorSet` of `samekey.v1`.
    pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("generated/samekey.v1.bin");
}

pub use client::{lookup_receipt, CallMetadata, CallMetadataLayer};
pub use context::{CallContext, CallContextLayer, CallIdSource, CallIds};
pub use idempotency::{
    store_ok_and_caller_errors, Idempotency, IdempotencyLayer, Keep, StoredReply, MAX_KEY_LEN,
};
pub use methods::{DescriptorError, MethodInfo, Methods};
pub use receipts::{receipts, ReceiptService};
pub use samekey_runtime::grpc_status::{classify_code, pushback, IdempotencyLevel};
