//! The listings' vocabulary: which receipts [`Store::list_receipts`](super::Store::list_receipts)
//! answers ([`ReceiptQuery`]), where a page ends ([`Cursor`]) and what it holds ([`ReceiptPage`]).
//!
//! # Guarantees
//!
//! * One order for the receipt listing: creation time, then key digest, which is how [`Cursor`]s compare,
//!   so a page starts right after the position where the one before it ended.
//! * A filter never ends a walk: a page the filters made short (even empty) is the last one only
//!   when its [`ReceiptPage::next`] is `None`.

use crate::receipt::{Receipt, ReceiptState};

/// Which receipts [`Store::list_receipts`](super::Store::list_receipts) answers: those created in
/// `[since_ms, until_ms)`, of one scope and some states if asked, after a cursor; ordered by creation
/// time, then key digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptQuery {
    /// Created at or after this time (Unix ms).
    pub since_ms: u64,
    /// Created before this time (Unix ms).
    pub until_ms: u64,
    /// Only this scope.
    pub scope: Option<String>,
    /// Only these states (empty: every state).
    pub states: Vec<ReceiptState>,
    /// Continue after this position (from [`ReceiptPage::next`]).
    pub after: Option<Cursor>,
    /// At most this many rows are read for one page.
    pub limit: usize,
}

impl ReceiptQuery {
    /// The receipts created in `[since_ms, until_ms)`, 1 000 rows a page.
    pub fn created_between(since_ms: u64, until_ms: u64) -> ReceiptQuery {
        ReceiptQuery {
            since_ms,
            until_ms,
            scope: None,
            states: Vec::new(),
            after: None,
            limit: 1_000,
        }
    }

    /// Only the receipts of `scope`.
    pub fn scope(mut self, scope: impl Into<String>) -> ReceiptQuery {
        self.scope = Some(scope.into());
        self
    }

    /// Only the receipts in one of `states`.
    pub fn states(mut self, states: impl IntoIterator<Item = ReceiptState>) -> ReceiptQuery {
        self.states = states.into_iter().collect();
        self
    }

    /// The page after `cursor`.
    pub fn after(mut self, cursor: Cursor) -> ReceiptQuery {
        self.after = Some(cursor);
        self
    }

    /// How many rows a page reads (at least 1).
    pub fn limit(mut self, limit: usize) -> ReceiptQuery {
        self.limit = limit.max(1);
        self
    }

    /// Whether `r` passes the query's filters (not its time range or cursor).
    pub fn admits(&self, r: &Receipt) -> bool {
        self.scope.as_deref().is_none_or(|s| r.key.scope() == s)
            && (self.states.is_empty() || self.states.contains(&r.state))
    }
}

/// A position in the order of [`Store::list_receipts`](super::Store::list_receipts): a receipt's
/// creation time and key digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cursor {
    /// The creation time (Unix ms).
    pub created_ms: u64,
    /// The key digest.
    pub digest: [u8; 32],
}

impl Cursor {
    /// The position of `r`.
    pub fn of(r: &Receipt) -> Cursor {
        Cursor {
            created_ms: r.created_ms,
            digest: *r.key.digest(),
        }
    }
}

/// One page of [`Store::list_receipts`](super::Store::list_receipts).
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiptPage {
    /// The receipts of the page that pass the filters, in order.
    pub receipts: Vec<Receipt>,
    /// Where the next page starts; `None` when this one is the last.
    pub next: Option<Cursor>,
}
