//! The finished receipts of one shard, in the order they may go.
//!
//! Receipts are kept in lanes, one per `ttl` (a function's, usually one of a few), each in the order
//! its receipts finished: within a lane, that is also the order they expire. Expiry takes the lane
//! front that expires first; a full store takes the one that finished first. Both are a pop from the
//! front of a queue, touching memory in the order it was written (a heap of expiry times, as before,
//! sifted through cold entries on every eviction).
//!
//! An entry names its receipt by its slot and its fence, which names one version of one record: every
//! claim and take-over of a shard's keys gets a fence of its own. An entry may outlive its receipt
//! (forgotten and the slot refilled, reopened and finished again): whoever pops it checks that the
//! slot still holds that version, finished, before removing it. A receipt reopened and finished again
//! is named by its second entry alone, and goes when that one comes up (not as early as it first
//! finished).

use std::collections::VecDeque;

use super::records::Slot;
use crate::receipt::Fence;

/// Distinct `ttl`s past this share the lane of the nearest one: their receipts may then wait behind
/// longer-lived ones (memory, not correctness: a read never answers an expired record).
const MAX_LANES: usize = 16;

/// A finished receipt: when it expires, and the version of the record it is (its slot and fence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Finished {
    pub(super) at: u64,
    pub(super) fence: Fence,
    pub(super) slot: Slot,
}

struct Lane {
    ttl_ms: u64,
    queue: VecDeque<Finished>,
}

impl Lane {
    /// When its front receipt finished.
    fn front_finished(&self) -> Option<u64> {
        self.queue.front().map(|f| f.at.saturating_sub(self.ttl_ms))
    }
}

/// A shard's finished receipts, by lane.
#[derive(Default)]
pub(super) struct Lanes {
    lanes: Vec<Lane>,
    /// The lane popped last.
    last: usize,
}

impl Lanes {
    /// Notes a receipt that finished, to expire at `expires_at_ms`.
    pub(super) fn push(&mut self, ttl_ms: u64, finished: Finished) {
        let lane = match self.lanes.iter().position(|l| l.ttl_ms == ttl_ms) {
            Some(lane) => lane,
            None if self.lanes.len() < MAX_LANES => {
                self.lanes.push(Lane {
                    ttl_ms,
                    queue: VecDeque::new(),
                });
                self.lanes.len() - 1
            }
            None => self
                .lanes
                .iter()
                .enumerate()
                .min_by_key(|(_, l)| l.ttl_ms.abs_diff(ttl_ms))
                .map_or(0, |(lane, _)| lane),
        };
        self.lanes[lane].queue.push_back(finished);
    }

    /// Takes the receipt that expires first, if it expired by `now_ms`.
    pub(super) fn pop_expired(&mut self, now_ms: u64) -> Option<Finished> {
        let (i, lane) = self
            .lanes
            .iter_mut()
            .enumerate()
            .filter(|(_, l)| l.queue.front().is_some_and(|f| f.at <= now_ms))
            .min_by_key(|(_, l)| l.queue.front().map(|f| f.at))?;
        self.last = i;
        lane.queue.pop_front()
    }

    /// When the receipt that finished first finished (or an entry it outlived: a hint).
    pub(super) fn oldest(&self) -> Option<u64> {
        self.lanes.iter().filter_map(Lane::front_finished).min()
    }

    /// Takes the receipt that finished first.
    pub(super) fn pop_oldest(&mut self) -> Option<Finished> {
        let (i, lane) = self
            .lanes
            .iter_mut()
            .enumerate()
            .filter(|(_, l)| !l.queue.is_empty())
            .min_by_key(|(_, l)| l.front_finished())?;
        self.last = i;
        lane.queue.pop_front()
    }

    /// The slots of the next two receipts of the lane popped last: the next pop's, likely.
    pub(super) fn upcoming(&self) -> [Option<Slot>; 2] {
        let queue = self.lanes.get(self.last).map(|l| &l.queue);
        let slot = |i| queue.and_then(|q| q.get(i)).map(|f: &Finished| f.slot);
        [slot(0), slot(1)]
    }

    /// How many receipts (and outlived entries) the lanes hold.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lanes.iter().map(|l| l.queue.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Lanes {
        /// Whether some lane holds `finished`.
        pub(in crate::store::memory) fn holds(&self, finished: Finished) -> bool {
            self.lanes.iter().any(|l| l.queue.contains(&finished))
        }

        /// Whether some lane entry names `slot` and is one `other` admits.
        pub(in crate::store::memory) fn names_slot(
            &self,
            slot: Slot,
            other: impl Fn(&Finished) -> bool,
        ) -> bool {
            self.lanes
                .iter()
                .any(|l| l.queue.iter().any(|f| f.slot == slot && other(f)))
        }
    }

    /// The receipt numbered `n`, expiring at `at`.
    fn finished(at: u64, n: u8) -> Finished {
        Finished {
            at,
            fence: Fence(u64::from(n)),
            slot: Slot::from(n),
        }
    }

    #[test]
    fn expiry_follows_each_lane_and_the_oldest_goes_first() {
        let mut lanes = Lanes::default();
        // At t = 0..4, alternating a 10 s ttl and a 1 s ttl.
        lanes.push(10_000, finished(10_000, 0));
        lanes.push(1_000, finished(1_001, 1));
        lanes.push(10_000, finished(10_002, 2));
        lanes.push(1_000, finished(1_003, 3));
        assert_eq!(lanes.pop_expired(1_000), None);
        // The short lane expires first, behind no long-lived receipt.
        assert_eq!(lanes.pop_expired(2_000), Some(finished(1_001, 1)));
        assert_eq!(lanes.pop_expired(2_000), Some(finished(1_003, 3)));
        assert_eq!(lanes.pop_expired(2_000), None);
        // Full: the one that finished first goes, whatever its ttl.
        lanes.push(1_000, finished(1_004, 4));
        assert_eq!(lanes.pop_oldest(), Some(finished(10_000, 0)));
        assert_eq!(lanes.pop_oldest(), Some(finished(10_002, 2)));
        assert_eq!(lanes.pop_oldest(), Some(finished(1_004, 4)));
        assert_eq!(lanes.pop_oldest(), None);
        assert_eq!(lanes.len(), 0);
    }

    #[test]
    fn ttls_past_the_lanes_share_the_nearest() {
        let mut lanes = Lanes::default();
        for ttl in 0..MAX_LANES as u64 + 4 {
            lanes.push(1_000 * (ttl + 1), finished(1_000 * (ttl + 1), ttl as u8));
        }
        assert_eq!(lanes.lanes.len(), MAX_LANES);
        assert_eq!(lanes.len(), MAX_LANES + 4);
        let mut expired = 0;
        while lanes.pop_expired(u64::MAX).is_some() {
            expired += 1;
        }
        assert_eq!(expired, MAX_LANES + 4);
    }
}
