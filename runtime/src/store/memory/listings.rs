//! Listings, counts and purges in memory: each scans the shards, one locked at a time; a page of
//! receipts keeps only its first positions as it goes (see [`MemoryStore`] on what a page costs).

use std::collections::BinaryHeap;

use super::{lock, Entry, MemoryStore};
use crate::error::StoreError;
use crate::receipt::{Receipt, ReceiptState};
#[cfg(doc)]
use crate::store::Store;
use crate::store::{Cursor, ReceiptPage, ReceiptQuery};

impl MemoryStore {
    /// [`Store::purge_expired`], without the future.
    pub(super) fn purge_expired_now(&self, now_ms: u64) -> Result<usize, StoreError> {
        let mut total = 0;
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            total += self.evict(&mut shard, now_ms, usize::MAX);
            shard.records.give_back_room();
        }
        self.purge_journals(now_ms);
        Ok(total)
    }

    /// [`Store::count_expired`], without the future.
    pub(super) fn count_expired_now(&self, now_ms: u64) -> Result<usize, StoreError> {
        Ok(self
            .shards
            .iter()
            .map(|shard| {
                lock(shard)
                    .records
                    .values()
                    .filter(|e| e.head.expired(now_ms))
                    .count()
            })
            .sum())
    }

    /// [`Store::list_receipts`], without the future.
    pub(super) fn list_receipts_now(
        &self,
        query: &ReceiptQuery,
        now_ms: u64,
    ) -> Result<ReceiptPage, StoreError> {
        let listed = |r: &Receipt| {
            (query.since_ms..query.until_ms).contains(&r.created_ms)
                && !r.expired(now_ms)
                && query.after.is_none_or(|after| Cursor::of(r) > after)
        };
        // One pass over the records keeps the first `limit + 1` positions (a bounded max-heap), and
        // only the page's receipts are copied: no index to keep up on the claim path, and a page of
        // 10⁶ receipts costs one scan, not a sort of them all. Most records are passed over on their
        // creation time alone.
        let limit = query.limit.max(1);
        let from_ms = query
            .after
            .map_or(query.since_ms, |c| c.created_ms.max(query.since_ms));
        let mut first: BinaryHeap<Cursor> = BinaryHeap::with_capacity(limit + 2);
        let mut bound = query.until_ms;
        for shard in self.shards.iter() {
            let shard = lock(shard);
            for entry in shard.records.values() {
                let r = &entry.head;
                if r.created_ms < from_ms || r.created_ms >= bound || !listed(r) {
                    continue;
                }
                let at = Cursor::of(r);
                if first.len() <= limit {
                    first.push(at);
                } else if first.peek().is_some_and(|last| at < *last) {
                    first.pop();
                    first.push(at);
                }
                if first.len() > limit {
                    // Nothing created after the heap's last can enter it any more.
                    bound = first.peek().map_or(bound, |last| last.created_ms + 1);
                }
            }
        }
        let mut page = first.into_sorted_vec();
        let next = (page.len() > limit).then(|| page[limit - 1]);
        page.truncate(limit);
        let receipts = page
            .iter()
            .filter_map(|at| {
                let shard = self.shard(&at.digest);
                let entry = shard.records.get(&at.digest)?;
                let r = &entry.head;
                (listed(r) && Cursor::of(r) == *at && query.admits(r)).then(|| entry.receipt())
            })
            .collect();
        Ok(ReceiptPage { receipts, next })
    }

    /// [`Store::list_orphans`], without the future.
    pub(super) fn list_orphans_now(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<Receipt>, StoreError> {
        let mut orphans =
            self.receipts_where(|r| r.state == ReceiptState::Processing && !r.lease_alive(now_ms));
        // After the shards' locks are released: the queue's lock is never taken under one.
        let queue = lock(&self.queue);
        orphans.retain(|r| !queue.contains_key(&r.call_id));
        drop(queue);
        orphans.sort_by_key(|r| r.lease_until_ms);
        orphans.truncate(limit);
        Ok(orphans)
    }

    /// Every record `keep` admits, one shard locked at a time.
    fn receipts_where(&self, keep: impl Fn(&Receipt) -> bool) -> Vec<Receipt> {
        let mut kept = Vec::new();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            kept.extend(
                shard
                    .records
                    .values()
                    .filter(|e| keep(&e.head))
                    .map(Entry::receipt),
            );
        }
        kept
    }
}
