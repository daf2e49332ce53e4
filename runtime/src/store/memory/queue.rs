//! The compensation queue in memory: one map of entries by callId, behind one lock that is never taken
//! under a shard's.

use std::collections::HashMap;

use super::{lock, MemoryStore};
use crate::call_id::CallId;
use crate::compensation::{CompensationEntry, CompensationState};
use crate::error::StoreError;
use crate::receipt::Fence;
#[cfg(doc)]
use crate::store::Store;

impl MemoryStore {
    /// [`Store::enqueue_compensation`], without the future.
    pub(super) fn enqueue_compensation_now(
        &self,
        entry: CompensationEntry,
    ) -> Result<(), StoreError> {
        lock(&self.queue)
            .entry(entry.call_id.clone())
            .or_insert(entry);
        Ok(())
    }

    /// [`Store::take_due_compensations`], without the future.
    pub(super) fn take_due_compensations_now(
        &self,
        now_ms: u64,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<CompensationEntry>, StoreError> {
        let lease_until_ms = now_ms.saturating_add(lease_ms);
        let mut queue = lock(&self.queue);
        let mut due: Vec<&mut CompensationEntry> = queue
            .values_mut()
            .filter(|e| match e.state {
                CompensationState::Pending => e.next_at_ms <= now_ms,
                CompensationState::Taken { lease_until_ms } => lease_until_ms <= now_ms,
                CompensationState::Manual => false,
            })
            .collect();
        due.sort_by_key(|e| (e.next_at_ms, e.enqueued_ms));
        Ok(due
            .into_iter()
            .take(limit)
            .map(|e| {
                e.state = CompensationState::Taken { lease_until_ms };
                e.fence = Fence(e.fence.0 + 1);
                e.clone()
            })
            .collect())
    }

    /// [`Store::reschedule_compensation`], without the future.
    pub(super) fn reschedule_compensation_now(
        &self,
        call_id: &CallId,
        fence: Fence,
        round: u32,
        delay_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let mut queue = lock(&self.queue);
        let entry = held_entry(&mut queue, call_id, fence)?;
        entry.round = round;
        entry.next_at_ms = now_ms.saturating_add(delay_ms);
        entry.state = CompensationState::Pending;
        Ok(())
    }

    /// [`Store::finish_compensation`], without the future.
    pub(super) fn finish_compensation_now(
        &self,
        call_id: &CallId,
        fence: Option<Fence>,
    ) -> Result<(), StoreError> {
        let mut queue = lock(&self.queue);
        if let (Some(fence), Some(entry)) = (fence, queue.get(call_id)) {
            if entry.fence != fence {
                return Err(StoreError::Fenced {
                    presented: fence.0,
                    current: entry.fence.0,
                });
            }
        }
        queue.remove(call_id);
        Ok(())
    }

    /// [`Store::escalate_compensation`], without the future.
    pub(super) fn escalate_compensation_now(
        &self,
        call_id: &CallId,
        fence: Fence,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let mut queue = lock(&self.queue);
        let entry = held_entry(&mut queue, call_id, fence)?;
        entry.state = CompensationState::Manual;
        entry.next_at_ms = now_ms;
        Ok(())
    }

    /// [`Store::list_compensations`], without the future.
    pub(super) fn list_compensations_now(&self) -> Result<Vec<CompensationEntry>, StoreError> {
        let mut all: Vec<CompensationEntry> = lock(&self.queue).values().cloned().collect();
        all.sort_by_key(|e| e.enqueued_ms);
        Ok(all)
    }
}

/// The queued entry of `call_id`, if the worker that presents `fence` still holds it.
// A callId's cached text form takes no part in its `Hash` and `Eq`: it is a key that does not change.
#[allow(clippy::mutable_key_type)]
fn held_entry<'q>(
    queue: &'q mut HashMap<CallId, CompensationEntry>,
    call_id: &CallId,
    fence: Fence,
) -> Result<&'q mut CompensationEntry, StoreError> {
    let entry = queue.get_mut(call_id).ok_or(StoreError::NotFound)?;
    if entry.fence != fence {
        return Err(StoreError::Fenced {
            presented: fence.0,
            current: entry.fence.0,
        });
    }
    Ok(entry)
}
