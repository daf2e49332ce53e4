//! What the counterparty says: one record of its file per call ([`RemoteRecord`]), the outcome it
//! names ([`RemoteOutcome`]), and a record that cannot be read ([`ReadError`]).

use crate::call_id::CallId;

/// What the counterparty says became of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteOutcome {
    /// It took effect.
    Succeeded,
    /// It failed.
    Failed,
}

/// One record of the counterparty: the call (by the callId sent to it, or by the business reference
/// both sides know it by), its outcome and, when the record has one, the amount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteRecord {
    /// The callId this side sent, when the counterparty kept it.
    pub call_id: Option<CallId>,
    /// The business reference (an order id), when the record has one: what
    /// [`Reconciler::by_reference`](super::Reconciler::by_reference) matches on.
    pub reference: Option<String>,
    /// What became of it there.
    pub outcome: RemoteOutcome,
    /// The amount there (minor units), when the record carries one.
    pub amount: Option<i64>,
}

/// A record of the counterparty's file that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record {record} cannot be read: {reason}")]
pub struct ReadError {
    /// The record's number in the file, from 1 (a line, or a CSV row after the header).
    pub record: u64,
    /// Why.
    pub reason: String,
}
