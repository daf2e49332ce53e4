//! Receipts: what a store records per call, and the state machine they follow.
//!
//! `RECEIVED → PROCESSING → SUCCESS | FAILED`, with `UNKNOWN` between `PROCESSING` and the terminal states
//! where the outcome is not established. Transitions only move forward; applying one that already
//! happened is a no-op reported as [`Transition::AlreadyApplied`] (re-entrant), so a duplicated callback
//! never triggers downstream work twice. A terminal state never changes.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::call_id::CallId;
use crate::key::{Fingerprint, Key};

/// The state of a receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReceiptState {
    /// The call was received and recorded but has not started.
    Received,
    /// The call is being executed by the owner of the claim.
    Processing,
    /// The outcome is not established (a timeout, a lost reply, a crashed owner); it waits for a lookup or
    /// for compensation.
    Unknown,
    /// The call took effect; the stored outcome is its result.
    Success,
    /// The call failed for good (a permanent error); the stored outcome is its error.
    Failed,
}

impl ReceiptState {
    /// `SUCCESS` or `FAILED`: the outcome is final.
    pub fn is_terminal(self) -> bool {
        matches!(self, ReceiptState::Success | ReceiptState::Failed)
    }

    fn rank(self) -> u8 {
        match self {
            ReceiptState::Received => 0,
            ReceiptState::Processing => 1,
            ReceiptState::Unknown => 2,
            ReceiptState::Success | ReceiptState::Failed => 3,
        }
    }

    /// Checks the move from `self` to `next`: forward moves are [`Transition::Applied`], the same state
    /// again is [`Transition::AlreadyApplied`], anything else is an error.
    pub fn advance(self, next: ReceiptState) -> Result<Transition, InvalidTransition> {
        if self == next {
            Ok(Transition::AlreadyApplied)
        } else if !self.is_terminal() && next.rank() > self.rank() {
            Ok(Transition::Applied)
        } else {
            Err(InvalidTransition {
                from: self,
                to: next,
            })
        }
    }

    /// The upper-case name used in text and in stores.
    pub fn as_str(self) -> &'static str {
        match self {
            ReceiptState::Received => "RECEIVED",
            ReceiptState::Processing => "PROCESSING",
            ReceiptState::Unknown => "UNKNOWN",
            ReceiptState::Success => "SUCCESS",
            ReceiptState::Failed => "FAILED",
        }
    }
}

impl fmt::Display for ReceiptState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ReceiptState {
    type Err = InvalidState;

    fn from_str(s: &str) -> Result<ReceiptState, InvalidState> {
        Ok(match s {
            "RECEIVED" => ReceiptState::Received,
            "PROCESSING" => ReceiptState::Processing,
            "UNKNOWN" => ReceiptState::Unknown,
            "SUCCESS" => ReceiptState::Success,
            "FAILED" => ReceiptState::Failed,
            _ => return Err(InvalidState(s.to_owned())),
        })
    }
}

/// A text that names no receipt state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a receipt state (RECEIVED, PROCESSING, UNKNOWN, SUCCESS, FAILED)")]
pub struct InvalidState(pub String);

/// A move the state machine refuses: backwards, or out of a terminal state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("receipt cannot move from {from} to {to}")]
pub struct InvalidTransition {
    /// The current state.
    pub from: ReceiptState,
    /// The refused target.
    pub to: ReceiptState,
}

/// What applying a transition did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The state changed.
    Applied,
    /// The receipt was already in that state; nothing changed (re-entrant).
    AlreadyApplied,
}

/// A fencing token: every claim or take-over of a key gets a larger one, and a write that presents an
/// older token is refused, so a stale owner's late completion cannot overwrite a newer owner's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Fence(pub u64);

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The stored record of one call on one key.
#[derive(Debug, Clone, PartialEq)]
pub struct Receipt {
    /// The idempotency key (a digest).
    pub key: Key,
    /// The call that owns the key.
    pub call_id: CallId,
    /// Where the call stands.
    pub state: ReceiptState,
    /// The fencing token of the current owner.
    pub fence: Fence,
    /// While `PROCESSING`: the owner's lease ends at this time (Unix ms); after it, the owner is presumed
    /// gone and the key may be resolved by someone else.
    pub lease_until_ms: Option<u64>,
    /// The record may be evicted after this time (Unix ms); `None` keeps it (claims and `UNKNOWN`s).
    pub expires_at_ms: Option<u64>,
    /// The fingerprint of the `verify` parts of the first call.
    pub fingerprint: Option<Fingerprint>,
    /// The encoded outcome: the result (`SUCCESS`) or the error (`FAILED`). `None` if it could not be
    /// encoded.
    pub outcome: Option<Arc<[u8]>>,
    /// When the key was first claimed (Unix ms).
    pub created_ms: u64,
    /// When the record last changed (Unix ms).
    pub updated_ms: u64,
}

impl Receipt {
    /// Whether the owner's lease is still running at `now_ms` (`RECEIVED` or `PROCESSING` only).
    pub fn lease_alive(&self, now_ms: u64) -> bool {
        matches!(
            self.state,
            ReceiptState::Received | ReceiptState::Processing
        ) && self.lease_until_ms.is_some_and(|t| t > now_ms)
    }

    /// Whether the record may be evicted at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_some_and(|t| t <= now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::ReceiptState::*;
    use super::*;

    #[test]
    fn transitions_only_move_forward() {
        assert_eq!(Received.advance(Processing), Ok(Transition::Applied));
        assert_eq!(Processing.advance(Success), Ok(Transition::Applied));
        assert_eq!(Processing.advance(Unknown), Ok(Transition::Applied));
        assert_eq!(Unknown.advance(Failed), Ok(Transition::Applied));
        assert_eq!(Success.advance(Success), Ok(Transition::AlreadyApplied));
        assert!(Success.advance(Failed).is_err());
        assert!(Failed.advance(Unknown).is_err());
        assert!(Unknown.advance(Processing).is_err());
        assert!(Processing.advance(Received).is_err());
    }

    #[test]
    fn states_round_trip_as_text() {
        for s in [Received, Processing, Unknown, Success, Failed] {
            assert_eq!(s.to_string().parse::<ReceiptState>(), Ok(s));
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.as_str())
            );
        }
        assert!("DONE".parse::<ReceiptState>().is_err());
    }
}
