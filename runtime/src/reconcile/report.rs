//! What a reconciliation found: exact counts of each kind of disagreement and the first examples of
//! each ([`ReconcileReport`]), one disagreement per [`Discrepancy`].

use crate::call_id::CallId;
use crate::receipt::ReceiptState;
use crate::reconcile::record::{ReadError, RemoteOutcome};

/// One disagreement between the two sides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discrepancy {
    /// The counterparty has the call; this side has no receipt of it (never made here, or expired).
    MissingHere {
        /// The call, as the counterparty's record names it.
        call_id: Option<CallId>,
        /// Its business reference, as the counterparty's record names it.
        reference: Option<String>,
    },
    /// This side has a receipt the counterparty never mentioned.
    MissingThere {
        /// The call.
        call_id: CallId,
        /// Its state here.
        state: ReceiptState,
    },
    /// Both have it, with different outcomes (`UNKNOWN` or `PROCESSING` here counts as different).
    StateMismatch {
        /// The call.
        call_id: CallId,
        /// Its state here.
        here: ReceiptState,
        /// Its outcome there.
        there: RemoteOutcome,
    },
    /// Both say it succeeded, for different amounts.
    AmountMismatch {
        /// The call.
        call_id: CallId,
        /// The amount here.
        here: i64,
        /// The amount there.
        there: i64,
    },
    /// A record of the counterparty's file could not be read.
    Unreadable(ReadError),
}

/// What a reconciliation found. Counts are exact; `examples` holds the first discrepancies of each
/// kind, up to [`Reconciler::examples`](super::Reconciler::examples) each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Counterparty records read.
    pub remote_records: u64,
    /// This side's receipts in the range.
    pub receipts: u64,
    /// Calls on which both sides agree.
    pub matched: u64,
    /// See [`Discrepancy::MissingHere`].
    pub missing_here: u64,
    /// See [`Discrepancy::MissingThere`].
    pub missing_there: u64,
    /// See [`Discrepancy::StateMismatch`].
    pub state_mismatches: u64,
    /// See [`Discrepancy::AmountMismatch`].
    pub amount_mismatches: u64,
    /// See [`Discrepancy::Unreadable`].
    pub unreadable: u64,
    /// Counterparty records whose receipt here lies outside the query (another scope or state,
    /// created outside the range): not compared.
    pub outside_query: u64,
    /// Counterparty records repeating a callId already read: not compared again.
    pub repeated: u64,
    /// The first discrepancies of each kind, with the callIds to look at.
    pub examples: Vec<Discrepancy>,
}

impl ReconcileReport {
    /// Whether both sides agree on every call.
    pub fn is_clean(&self) -> bool {
        self.missing_here
            + self.missing_there
            + self.state_mismatches
            + self.amount_mismatches
            + self.unreadable
            == 0
    }
}
