//! Reconciliation: this side's receipts over a time range against the counterparty's records of the
//! same calls (a settlement file, an export), by callId or by business reference.
//!
//! Prevention (keys, callIds, lookups) never makes the other side's system perfect; a daily comparison
//! is the net under it. [`Reconciler::run`] reads the counterparty's records as a stream (a CSV or
//! JSON-lines reader is provided: `read_csv` with the feature `csv`, [`read_jsonl`]), looks each one
//! up here — by the callId this side sent, or, with [`Reconciler::by_reference`], by the business
//! reference (an order id) that this side's idempotency key is made of — then walks this side's
//! receipts of the range in pages and reports those the other side never mentioned.
//!
//! # Memory
//!
//! Bounded by the day's size, not its content: one 64-bit hash per counterparty record (to find this
//! side's receipts it never mentioned; two by reference), one batch of counterparty records (1 000,
//! looked up at once: one statement on the SQL stores when matched by callId) and one page of receipts
//! at a time, and the first [`Reconciler::examples`] discrepancies of each kind. Counts are exact. A
//! day of 10⁶ records keeps about 16 MB of hashes (32 MB by reference).
//!
//! # Layout
//!
//! * `record`: what the counterparty says ([`RemoteRecord`], [`RemoteOutcome`]) and a record that
//!   cannot be read ([`ReadError`]).
//! * `read`: the readers of its files, JSON lines ([`read_jsonl`]) and CSV (`read_csv`, feature
//!   `csv`).
//! * `matcher`: the [`Reconciler`], which matches the records with this side's receipts.
//! * `report`: what it found ([`ReconcileReport`], [`Discrepancy`]).

mod matcher;
mod read;
mod record;
mod report;

pub use matcher::Reconciler;
#[cfg(feature = "csv")]
pub use read::read_csv;
pub use read::read_jsonl;
pub use record::{ReadError, RemoteOutcome, RemoteRecord};
pub use report::{Discrepancy, ReconcileReport};
