//! The callId index of one slice of callIds: which key a callId claimed.
//!
//! Indexed by the callId's time and 64 random bits (16 bytes) rather than by the whole callId (88
//! bytes, and two label comparisons per probe): a receipt's share of the index is 48 bytes, not 120.
//! Two callIds that share those 16 bytes (the same callId adopted by two keys, or a collision of the
//! random bits within one millisecond) are told apart by an overflow map keyed by the whole callId,
//! empty in practice. A reader checks the record it finds against the callId it asked for.

use super::{Digest, FastMap};
use crate::call_id::CallId;

/// The part of a callId the index is keyed by.
fn short(call_id: &CallId) -> (u64, u64) {
    (call_id.entropy(), call_id.unix_ms())
}

#[derive(Default)]
pub(super) struct CallIndex {
    by_short: FastMap<(u64, u64), Digest>,
    /// CallIds whose short form another key's callId took first.
    overflow: FastMap<CallId, Digest>,
}

impl CallIndex {
    /// Notes that `call_id` claimed `digest`.
    pub(super) fn insert(&mut self, call_id: &CallId, digest: Digest) {
        match self.by_short.entry(short(call_id)) {
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(digest);
            }
            std::collections::hash_map::Entry::Occupied(slot) if *slot.get() == digest => {}
            std::collections::hash_map::Entry::Occupied(_) => {
                self.overflow.insert(call_id.clone(), digest);
            }
        }
    }

    /// The key `call_id` claimed, if any (check the record: another callId may share the entry).
    pub(super) fn get(&self, call_id: &CallId) -> Option<Digest> {
        if !self.overflow.is_empty() {
            if let Some(digest) = self.overflow.get(call_id) {
                return Some(*digest);
            }
        }
        self.by_short.get(&short(call_id)).copied()
    }

    /// Forgets that `call_id` claimed `digest` (its record went).
    pub(super) fn remove(&mut self, call_id: &CallId, digest: &Digest) {
        if !self.overflow.is_empty() && self.overflow.get(call_id) == Some(digest) {
            self.overflow.remove(call_id);
            return;
        }
        let short = short(call_id);
        if self.by_short.get(&short) == Some(digest) {
            self.by_short.remove(&short);
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_short.len() + self.overflow.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call_id::Label;

    #[test]
    fn one_call_id_on_two_keys_and_removals_in_any_order() {
        let mut index = CallIndex::default();
        let call = CallId::generate_at(Label::from_static("t"), Label::from_static("n"), 7);
        let other = CallId::generate_at(Label::from_static("t"), Label::from_static("n"), 7);
        index.insert(&call, [1; 32]);
        index.insert(&other, [3; 32]);
        // The same callId adopted by a second key: both kept.
        index.insert(&call, [2; 32]);
        assert_eq!(index.len(), 3);
        assert_eq!(index.get(&call), Some([2; 32]), "the later claim");
        assert_eq!(index.get(&other), Some([3; 32]));
        index.remove(&call, &[2; 32]);
        assert_eq!(index.get(&call), Some([1; 32]));
        index.remove(&call, &[1; 32]);
        assert_eq!(index.get(&call), None);
        // A removal of a record the index no longer points to changes nothing.
        index.remove(&other, &[9; 32]);
        assert_eq!(index.get(&other), Some([3; 32]));
    }
}
