//! The compensation queue's entries. Calls whose outcome stays uncertain after their retries are marked
//! `UNKNOWN` and queued here, in the store, so that a bounded process (re-query receipts, reverse, retry
//! at growing intervals, then escalate to a person) resolves them. No entry is retried forever or dropped.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::call_id::CallId;
use crate::journal::AttemptOutcome;
use crate::key::Key;
use crate::receipt::Fence;

/// Where a queued entry stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CompensationState {
    /// Waiting for its next round at `next_at_ms`.
    Pending,
    /// Taken by a worker until `lease_until_ms`.
    Taken {
        /// The worker's lease ends at this time (Unix ms); then the entry is due again.
        lease_until_ms: u64,
    },
    /// The rounds ran out: a person must decide.
    Manual,
}

/// One uncertain call waiting for compensation.
#[derive(Debug, Clone, PartialEq)]
pub struct CompensationEntry {
    /// The uncertain call.
    pub call_id: CallId,
    /// Its idempotency key.
    pub key: Key,
    /// Why it was queued (for people).
    pub reason: String,
    /// Rounds done so far.
    pub round: u32,
    /// When the next round is due (Unix ms).
    pub next_at_ms: u64,
    /// Where it stands.
    pub state: CompensationState,
    /// When it was queued (Unix ms).
    pub enqueued_ms: u64,
    /// The worker fence of its latest take (0: never taken). A worker presents it to reschedule,
    /// escalate or finish the entry, and is refused once another worker took it.
    pub fence: Fence,
    /// How many attempts the call made before it was queued (0: none ran here, e.g. an orphan).
    pub attempts: u32,
    /// How its last attempt ended (its error class, or a timeout), when it is known.
    pub last_error: Option<AttemptOutcome>,
    /// The call's inputs, encoded (JSON), when its function keeps them (`#[idempotent(inputs = …)]`):
    /// what a reversal or a re-run needs, without rebuilding the business arguments by hand. Read
    /// them with [`CompensationEntry::inputs`].
    pub encoded_inputs: Option<Arc<[u8]>>,
}

/// The longest reason an entry keeps, in characters (at most 4 000 bytes of UTF-8: any store's text
/// column holds it).
pub const MAX_REASON_CHARS: usize = 1_000;

impl CompensationEntry {
    /// A new pending entry, due at once. Its reason is kept to its first
    /// [`MAX_REASON_CHARS`] characters: it often quotes an error (a proxy's whole error page), and
    /// the entry must be written whatever its length.
    pub fn new(call_id: CallId, key: Key, reason: impl Into<String>, now_ms: u64) -> Self {
        CompensationEntry {
            call_id,
            key,
            reason: crate::codec::bounded(reason.into(), MAX_REASON_CHARS),
            round: 0,
            next_at_ms: now_ms,
            state: CompensationState::Pending,
            enqueued_ms: now_ms,
            fence: Fence(0),
            attempts: 0,
            last_error: None,
            encoded_inputs: None,
        }
    }

    /// The call's inputs, decoded as `T` (the tuple of the arguments its function keeps, in the order
    /// `inputs = …` names them, owned: `(String, u64)` for `order_id: &str, amount: u64`). `None` when
    /// the function keeps none.
    pub fn inputs<T: DeserializeOwned>(&self) -> Option<Result<T, serde_json::Error>> {
        self.encoded_inputs
            .as_deref()
            .map(|bytes| serde_json::from_slice(bytes))
    }
}
