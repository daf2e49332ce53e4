//! The journals in memory: each key's latest events, kept while its record lives and at least as long
//! as its latest append asked, and which key each callId's events are under.

use std::collections::VecDeque;

use super::{lock, Digest, FastMap, MemoryStore};
use crate::call_id::CallId;
use crate::error::StoreError;
use crate::journal::{Event, JOURNAL_LIMIT};
use crate::key::Key;
#[cfg(doc)]
use crate::store::Store;

/// The journals of the in-memory store, and which key each callId's events are under.
#[derive(Default)]
pub(super) struct Journals {
    by_key: FastMap<Digest, KeyJournal>,
    calls: FastMap<CallId, Digest>,
}

#[derive(Default)]
struct KeyJournal {
    events: VecDeque<Event>,
    keep_until_ms: u64,
}

impl MemoryStore {
    /// [`Store::append_journal`], without the future.
    pub(super) fn append_journal_now(
        &self,
        key: &Key,
        events: &[Event],
        keep_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let mut journals = lock(&self.journals);
        let Journals { by_key, calls } = &mut *journals;
        let journal = by_key.entry(*key.digest()).or_default();
        journal.keep_until_ms = journal.keep_until_ms.max(now_ms.saturating_add(keep_ms));
        for event in events {
            calls.insert(event.call_id.clone(), *key.digest());
            journal.events.push_back(event.clone());
        }
        let excess = journal.events.len().saturating_sub(JOURNAL_LIMIT);
        journal.events.drain(..excess);
        Ok(())
    }

    /// [`Store::journal`], without the future.
    pub(super) fn journal_now(&self, key: &Key, now_ms: u64) -> Result<Vec<Event>, StoreError> {
        Ok(self.journal_where(key.digest(), now_ms, |_| true))
    }

    /// [`Store::journaled_keys`], without the future.
    pub(super) fn journaled_keys_now(
        &self,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError> {
        let journals = lock(&self.journals);
        Ok(crate::store::page_of_keys(
            journals.by_key.keys().copied(),
            after,
            limit,
        ))
    }

    /// [`Store::journal_of_call`], without the future.
    pub(super) fn journal_of_call_now(
        &self,
        call_id: &CallId,
        now_ms: u64,
    ) -> Result<Vec<Event>, StoreError> {
        let Some(digest) = lock(&self.journals).calls.get(call_id).copied() else {
            return Ok(Vec::new());
        };
        Ok(self.journal_where(&digest, now_ms, |e| &e.call_id == call_id))
    }

    /// Whether `digest` has a live record at `now_ms` (taking its shard's lock: never call it holding
    /// the journals' lock).
    fn holds(&self, digest: &Digest, now_ms: u64) -> bool {
        self.shard(digest)
            .records
            .get(digest)
            .is_some_and(|e| !e.head.expired(now_ms))
    }

    /// The events `keep` admits of the journal of `digest`, if it is still kept at `now_ms`.
    fn journal_where(
        &self,
        digest: &Digest,
        now_ms: u64,
        keep: impl Fn(&Event) -> bool,
    ) -> Vec<Event> {
        let held = self.holds(digest, now_ms);
        let journals = lock(&self.journals);
        match journals.by_key.get(digest) {
            Some(j) if held || j.keep_until_ms > now_ms => {
                j.events.iter().filter(|e| keep(e)).cloned().collect()
            }
            _ => Vec::new(),
        }
    }

    /// Drops the journals kept past `keep_ms` whose key holds no live record.
    pub(super) fn purge_journals(&self, now_ms: u64) {
        let due: Vec<Digest> = lock(&self.journals)
            .by_key
            .iter()
            .filter(|(_, j)| j.keep_until_ms <= now_ms)
            .map(|(digest, _)| *digest)
            .collect();
        let dead: Vec<Digest> = due.into_iter().filter(|d| !self.holds(d, now_ms)).collect();
        let mut journals = lock(&self.journals);
        let Journals { by_key, calls } = &mut *journals;
        for digest in dead {
            // Appended to meanwhile: kept.
            if by_key
                .get(&digest)
                .is_some_and(|j| j.keep_until_ms <= now_ms)
            {
                if let Some(j) = by_key.remove(&digest) {
                    for e in j.events {
                        if calls.get(&e.call_id) == Some(&digest) {
                            calls.remove(&e.call_id);
                        }
                    }
                }
            }
        }
    }
}
