//! A shard's records, each found by its key's digest, which the record itself holds: the table stores
//! one pointer per record (8 bytes, not the 40 of a map from digest to pointer), and a probe compares
//! a digest only where the table's own hash bits already match.

use hashbrown::HashTable;

use super::{Digest, Entry};
use crate::call_id::CallId;

/// The table's hash of a digest: its first 8 bytes (SHA-256 output: already uniform).
pub(super) fn hash(digest: &Digest) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(word)
}

/// The table's hash of a record: its digest's.
fn hash_of(entry: &Entry) -> u64 {
    hash(entry.receipt.key.digest())
}

#[derive(Default)]
pub(super) struct Records(HashTable<Box<Entry>>);

impl Records {
    pub(super) fn get(&self, digest: &Digest) -> Option<&Entry> {
        self.0
            .find(hash(digest), |e| e.receipt.key.digest() == digest)
            .map(|e| &**e)
    }

    pub(super) fn get_mut(&mut self, digest: &Digest) -> Option<&mut Entry> {
        self.0
            .find_mut(hash(digest), |e| e.receipt.key.digest() == digest)
            .map(|e| &mut **e)
    }

    /// The record `call_id` claimed, among those whose digest hashes to `hashed`.
    pub(super) fn of_call(&self, hashed: u64, call_id: &CallId) -> Option<&Entry> {
        self.0
            .find(hashed, |e| {
                hash_of(e) == hashed && &e.receipt.call_id == call_id
            })
            .map(|e| &**e)
    }

    /// Adds a record whose key the table does not hold (the caller looked).
    pub(super) fn insert_new(&mut self, entry: Box<Entry>) {
        let digest_hash = hash_of(&entry);
        self.0.insert_unique(digest_hash, entry, |e| hash_of(e));
    }

    pub(super) fn remove(&mut self, digest: &Digest) -> Option<Box<Entry>> {
        self.0
            .find_entry(hash(digest), |e| e.receipt.key.digest() == digest)
            .ok()
            .map(|found| found.remove().0)
    }

    /// Removes the finished record that a lane entry names: its digest hashes to `hashed` and it
    /// expires at `at`. `None` when that record went or changed since (forgotten, or expired and
    /// claimed anew). Two keys of one shard whose digests share their first 8 bytes and that also
    /// expire in the same millisecond are one for this look (by chance, one in 2⁶⁴ a pair; keys
    /// come from callers, so such a pair can be made on purpose, at about 2³⁵ hashes): either is a
    /// finished receipt as old as the other, and the other's entry, the same, takes the one left.
    pub(super) fn remove_finished(&mut self, hashed: u64, at: u64) -> Option<Box<Entry>> {
        self.0
            .find_entry(hashed, |e| {
                hash_of(e) == hashed
                    && e.receipt.state.is_terminal()
                    && e.receipt.expires_at_ms == Some(at)
            })
            .ok()
            .map(|found| found.remove().0)
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Entry> {
        self.0.iter().map(|e| &**e)
    }
}
