//! The receipts in memory: the claim, the take-over, the owner's fenced writes and the reads, each under
//! the lock of its key's shard, which also hands out the key's fences; the waiters of a `PROCESSING`
//! record park on it and are handed the record as it settles.

use std::time::Duration;

use super::calls::Place;
use super::finished::Finished;
use super::outcome::Outcome;
use super::records::Slot;
use super::{Entry, MemoryStore, Shard, Waiting, EVICT_PER_CLAIM};
use crate::call_id::CallId;
use crate::codec::Kept;
use crate::error::StoreError;
use crate::key::Key;
use crate::receipt::{Fence, Receipt, ReceiptState, Transition};
use crate::store::{Claim, Claimed, Completion, Store};

impl MemoryStore {
    pub(super) fn owned<'a>(
        shard: &'a mut Shard,
        key: &Key,
        fence: Fence,
    ) -> Result<&'a mut Entry, StoreError> {
        Self::owned_at(shard, key, fence).map(|(_, entry)| entry)
    }

    /// [`MemoryStore::owned`], and the record's slot.
    fn owned_at<'a>(
        shard: &'a mut Shard,
        key: &Key,
        fence: Fence,
    ) -> Result<(Slot, &'a mut Entry), StoreError> {
        let (slot, entry) = shard
            .records
            .get_mut_at(key.digest())
            .ok_or(StoreError::NotFound)?;
        if entry.head.fence != fence {
            return Err(StoreError::Fenced {
                presented: fence.0,
                current: entry.head.fence.0,
            });
        }
        Ok((slot, entry))
    }

    /// The record of `key` if it is live at `now_ms`, or, when it is `PROCESSING`, a registration for
    /// its next change. The registration is made and enabled under the shard's lock, which every
    /// change holds while it wakes the waiters: no change can fall between the look and the
    /// registration, and a record replaced meanwhile (released and claimed anew) is never waited on.
    pub(super) fn settled_or_waiter(
        &self,
        key: &Key,
        now_ms: u64,
    ) -> Result<Option<Receipt>, Waiting> {
        let mut shard = self.shard(key.digest());
        match shard.records.get_mut(key.digest()) {
            Some(entry) if !entry.head.expired(now_ms) => {
                if entry.head.state == ReceiptState::Processing {
                    let waiters = entry.waiters.get_or_insert_with(Default::default).clone();
                    let mut waiter = Box::pin(waiters.notify.clone().notified_owned());
                    waiter.as_mut().enable();
                    Err((waiter, waiters))
                } else {
                    Ok(Some(entry.receipt()))
                }
            }
            _ => Ok(None),
        }
    }

    /// [`Store::claim`], without the future: the runtime calls it directly on its default store.
    pub(crate) fn claim_now(&self, claim: Claim) -> Result<Claimed, StoreError> {
        let digest = *claim.key.digest();
        let mut looked_elsewhere = 0;
        let mut shard = loop {
            let mut shard = self.shard(&digest);
            self.evict(&mut shard, claim.now_ms, EVICT_PER_CLAIM);
            if let Some(entry) = shard.records.get(&digest) {
                if !entry.head.expired(claim.now_ms) {
                    return Ok(Claimed::Existing(entry.receipt()));
                }
                self.remove(&mut shard, &digest);
            }
            if self.take_place(&mut shard) {
                break shard;
            }
            // Full, and nothing this shard may evict: evict elsewhere (this shard's lock given back
            // first: one shard locked at a time), then look at the key again. A few rounds lost to
            // other claims taking the room first end as full.
            drop(shard);
            looked_elsewhere += 1;
            if looked_elsewhere > 3 || !self.make_room_anywhere() {
                return Err(StoreError::Full {
                    capacity: self.capacity as u64,
                });
            }
        };
        let fence = next_fence(&mut shard.fence);
        self.calls_of(&claim.call_id)
            .insert(&claim.call_id, Place::of(&digest));
        shard.records.insert_new(Entry {
            head: Receipt {
                key: claim.key,
                call_id: claim.call_id,
                state: ReceiptState::Processing,
                fence,
                lease_until_ms: Some(claim.now_ms.saturating_add(claim.lease_ms)),
                expires_at_ms: None,
                fingerprint: claim.fingerprint,
                outcome: None,
                created_ms: claim.now_ms,
                updated_ms: claim.now_ms,
            },
            outcome: Outcome::None,
            waiters: None,
            kept: None,
        });
        Ok(Claimed::Acquired(fence))
    }

    /// What `read` makes of the fingerprint and the stored result of `key`'s `SUCCESS` receipt, if
    /// the store holds one live at `now_ms` (a replay answered without a claim), and of the slot
    /// where replays keep that result decoded (see `Keeper`). `read` runs under the shard's lock:
    /// keep it short.
    pub(crate) fn read_success<R>(
        &self,
        key: &Key,
        now_ms: u64,
        read: impl FnOnce(Option<crate::key::Fingerprint>, &[u8], &mut Option<Kept>) -> Option<R>,
    ) -> Option<R> {
        let mut shard = self.shard(key.digest());
        let Entry {
            head,
            outcome,
            kept,
            ..
        } = shard.records.get_mut(key.digest())?;
        if head.state != ReceiptState::Success || head.expired(now_ms) {
            return None;
        }
        read(head.fingerprint, outcome.bytes()?, kept)
    }

    /// [`Store::complete`], without the future.
    pub(crate) fn complete_now(
        &self,
        key: &Key,
        fence: Fence,
        completion: Completion,
        now_ms: u64,
    ) -> Result<Transition, StoreError> {
        let mut shard = self.shard(key.digest());
        let (slot, entry) = Self::owned_at(&mut shard, key, fence)?;
        let transition = check(entry.head.state, completion.state)?;
        if transition == Transition::Applied {
            let r = &mut entry.head;
            r.state = completion.state;
            entry.outcome = Outcome::new(completion.outcome);
            r.lease_until_ms = None;
            let expires_at_ms = now_ms.saturating_add(completion.ttl_ms);
            r.expires_at_ms = Some(expires_at_ms);
            r.updated_ms = now_ms;
            entry.wake();
            let finished = Finished {
                at: expires_at_ms,
                fence,
                slot,
            };
            shard.finished.push(completion.ttl_ms, finished);
        }
        Ok(transition)
    }

    /// [`Store::take_over`], without the future; with `finished`, [`Store::reopen`].
    pub(super) fn take_over_now(
        &self,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        now_ms: u64,
        finished: bool,
    ) -> Result<Claimed, StoreError> {
        let mut shard = self.shard(key.digest());
        let Shard { records, fence, .. } = &mut *shard;
        let entry = records.get_mut(key.digest()).ok_or(StoreError::NotFound)?;
        let r = &entry.head;
        let open = match r.state {
            ReceiptState::Unknown => !finished,
            ReceiptState::Received | ReceiptState::Processing => {
                !finished && !r.lease_alive(now_ms)
            }
            ReceiptState::Success | ReceiptState::Failed => finished,
        };
        if r.fence != expected || !open {
            return Ok(Claimed::Existing(entry.receipt()));
        }
        if finished {
            // Reopened: no expiry until its next outcome, and no decoded copy of the old one.
            entry.head.expires_at_ms = None;
            entry.outcome = Outcome::None;
            entry.kept = None;
        }
        let r = &mut entry.head;
        r.fence = next_fence(fence);
        r.state = ReceiptState::Processing;
        r.lease_until_ms = Some(now_ms.saturating_add(lease_ms));
        r.updated_ms = now_ms;
        let fence = r.fence;
        entry.wake();
        Ok(Claimed::Acquired(fence))
    }

    /// [`Store::extend_lease`], without the future.
    pub(super) fn extend_lease_now(
        &self,
        key: &Key,
        fence: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let mut shard = self.shard(key.digest());
        let entry = Self::owned(&mut shard, key, fence)?;
        if entry.head.state != ReceiptState::Processing {
            return Err(StoreError::InvalidTransition {
                from: entry.head.state,
                to: ReceiptState::Processing,
            });
        }
        entry.head.lease_until_ms = Some(now_ms.saturating_add(lease_ms));
        Ok(())
    }

    /// [`Store::mark_unknown`], without the future.
    pub(super) fn mark_unknown_now(
        &self,
        key: &Key,
        fence: Fence,
        now_ms: u64,
    ) -> Result<Transition, StoreError> {
        let mut shard = self.shard(key.digest());
        let entry = Self::owned(&mut shard, key, fence)?;
        let transition = check(entry.head.state, ReceiptState::Unknown)?;
        if transition == Transition::Applied {
            let r = &mut entry.head;
            r.state = ReceiptState::Unknown;
            r.lease_until_ms = None;
            r.expires_at_ms = None;
            r.updated_ms = now_ms;
            entry.wake();
        }
        Ok(transition)
    }

    /// [`Store::release`], without the future.
    pub(super) fn release_now(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        let mut shard = self.shard(key.digest());
        let entry = match Self::owned(&mut shard, key, fence) {
            Ok(entry) => entry,
            Err(StoreError::NotFound) => return Ok(()),
            Err(e) => return Err(e),
        };
        if entry.head.state != ReceiptState::Processing {
            return Err(StoreError::InvalidTransition {
                from: entry.head.state,
                to: ReceiptState::Received,
            });
        }
        self.remove(&mut shard, key.digest());
        Ok(())
    }

    /// [`Store::forget`], without the future.
    pub(super) fn forget_now(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        let mut shard = self.shard(key.digest());
        let entry = Self::owned(&mut shard, key, fence)?;
        if !entry.head.state.is_terminal() {
            return Err(StoreError::InvalidTransition {
                from: entry.head.state,
                to: ReceiptState::Received,
            });
        }
        self.remove(&mut shard, key.digest());
        Ok(())
    }

    /// [`Store::get`], without the future.
    pub(super) fn get_now(&self, key: &Key, now_ms: u64) -> Result<Option<Receipt>, StoreError> {
        let shard = self.shard(key.digest());
        Ok(shard
            .records
            .get(key.digest())
            .filter(|e| !e.head.expired(now_ms))
            .map(Entry::receipt))
    }

    /// [`Store::get_by_call_id`], without the future.
    pub(super) fn get_by_call_id_now(
        &self,
        call_id: &CallId,
    ) -> Result<Option<Receipt>, StoreError> {
        // Looked up first, each shard locked after the index's lock is given back (a claim takes them
        // the other way round).
        let candidates = self.calls_of(call_id).candidates(call_id);
        Ok(candidates.into_iter().find_map(|place| {
            let shard = self.shard_at(usize::from(place.shard));
            shard
                .records
                .of_call(place.hash, call_id)
                .map(Entry::receipt)
        }))
    }

    /// [`Store::wait_settled`]: parked on the record's waiters, handed the record as it settles, or
    /// reading it again when `timeout` ends.
    pub(super) async fn settled_within(
        &self,
        key: &Key,
        timeout: Duration,
        now_ms: u64,
    ) -> Result<Option<Receipt>, StoreError> {
        let (notified, waiters) = match self.settled_or_waiter(key, now_ms) {
            Ok(settled) => return Ok(settled),
            Err(waiting) => waiting,
        };
        let started = tokio::time::Instant::now();
        let _ = tokio::time::timeout(timeout, notified).await;
        if let Some(settled) = waiters.settled.get() {
            return Ok(Some(settled.clone()));
        }
        let waited = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.get(key, now_ms.saturating_add(waited)).await
    }
}

/// A fence larger than any its shard gave out (`last`: the shard's last one).
fn next_fence(last: &mut u64) -> Fence {
    *last += 1;
    Fence(*last)
}

fn check(from: ReceiptState, to: ReceiptState) -> Result<Transition, StoreError> {
    from.advance(to).map_err(|e| StoreError::InvalidTransition {
        from: e.from,
        to: e.to,
    })
}
