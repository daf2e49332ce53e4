//! Why an owner's write changed nothing: the answer every backend whose write is one conditional
//! statement or script gives once the condition failed, from the record as it is now.
//!
//! # Guarantees
//!
//! * No record is [`StoreError::NotFound`]; a record under another fence is [`StoreError::Fenced`]
//!   (the fence presented and the record's); a record under the owner's fence that cannot move to
//!   the target state is [`StoreError::InvalidTransition`], unless it is there already and the write
//!   may be repeated ([`Transition::AlreadyApplied`]).

use crate::error::StoreError;
use crate::receipt::{Fence, Receipt, ReceiptState, Transition};

/// Why an owner's write (under `fence`, towards `to`) changed nothing, from the record as it is now
/// (`None`: no live record): the answer every backend whose write is one conditional statement or
/// script gives after the condition failed.
pub(crate) fn not_owned(current: Option<&Receipt>, fence: Fence, to: ReceiptState) -> StoreError {
    match current {
        None => StoreError::NotFound,
        Some(current) if current.fence != fence => StoreError::Fenced {
            presented: fence.0,
            current: current.fence.0,
        },
        Some(current) => StoreError::InvalidTransition {
            from: current.state,
            to,
        },
    }
}

/// Like [`not_owned`], for a transition that may be repeated: a record already in `target` under
/// `fence` is the same write again ([`Transition::AlreadyApplied`]).
pub(crate) fn already_or_not_owned(
    current: Option<&Receipt>,
    fence: Fence,
    target: ReceiptState,
) -> Result<Transition, StoreError> {
    match current {
        Some(c) if c.fence == fence && c.state == target => Ok(Transition::AlreadyApplied),
        other => Err(not_owned(other, fence, target)),
    }
}
