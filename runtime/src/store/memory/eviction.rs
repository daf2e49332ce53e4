//! How the store stays bounded: every claim evicts a few expired records of its shard (a purge, all
//! of them), and a bounded store that is full makes room by evicting a finished record, never a call
//! in flight or an `UNKNOWN` (see [Capacity](MemoryStore#capacity)). A record removed takes its
//! waiters' wake-up, its callId index entry and its place with it.

use std::sync::atomic::Ordering;

use super::calls::Place;
use super::finished::Lanes;
use super::{lock, Digest, Entry, MemoryStore, Shard};

impl MemoryStore {
    /// Removes the record of `digest` (and its callId index entry), waking its waiters.
    pub(super) fn remove(&self, shard: &mut Shard, digest: &Digest) {
        if let Some(mut entry) = shard.records.remove(digest) {
            self.let_go(&mut entry, false);
        }
    }

    /// What goes with a record removed from its shard: its waiters woken, its callId index entry,
    /// and, in a bounded store, its place, unless `keep_place` (the caller's new record takes it).
    pub(super) fn let_go(&self, entry: &mut Entry, keep_place: bool) {
        entry.wake();
        let receipt = &entry.head;
        self.calls_of(&receipt.call_id)
            .remove(&receipt.call_id, Place::of(receipt.key.digest()));
        if !keep_place && self.bounded_store() {
            self.held.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Evicts up to `limit` records of `shard` that expired before `now_ms`; returns how many.
    pub(super) fn evict(&self, shard: &mut Shard, now_ms: u64, limit: usize) -> usize {
        let mut evicted = 0;
        while evicted < limit {
            let Some(mut entry) = shard.take_finished(|lanes| lanes.pop_expired(now_ms)) else {
                break;
            };
            self.let_go(&mut entry, false);
            evicted += 1;
        }
        evicted
    }

    /// Evicts `shard`'s finished record that finished first; `keep_place`: its place goes to the
    /// caller's new record (the store's count does not move). `false` if it holds none (every record
    /// in flight or `UNKNOWN`).
    pub(super) fn make_room(&self, shard: &mut Shard, keep_place: bool) -> bool {
        let Some(mut entry) = shard.take_finished(Lanes::pop_oldest) else {
            return false;
        };
        self.let_go(&mut entry, keep_place);
        true
    }

    /// Takes a place for a new record of `shard`, making room there when the store is full. `false`
    /// if the store is full and `shard` holds nothing it may evict. At steady state (full) a claim
    /// takes the place of the receipt it evicts, and the shared count is only read.
    pub(super) fn take_place(&self, shard: &mut Shard) -> bool {
        if !self.bounded_store() {
            return true;
        }
        let mut held = self.held.load(Ordering::Acquire);
        while held < self.capacity {
            match self.held.compare_exchange_weak(
                held,
                held + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => held = now,
            }
        }
        self.make_room(shard, true)
    }

    /// Evicts the finished record that finished first in the whole store, one shard locked at a time
    /// (the caller holds none). `false` if the store holds none.
    pub(super) fn make_room_anywhere(&self) -> bool {
        loop {
            let oldest = self
                .shards
                .iter()
                .enumerate()
                .filter_map(|(i, shard)| lock(shard).finished.oldest().map(|at| (at, i)))
                .min();
            let Some((_, i)) = oldest else {
                return false;
            };
            if self.make_room(&mut self.shard_at(i), false) {
                return true;
            }
            // That shard's oldest went meanwhile: look again.
        }
    }
}
