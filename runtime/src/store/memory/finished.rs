//! The finished receipts of one shard, in the order they may go.
//!
//! Receipts are kept in lanes, one per `ttl` (a function's, usually one of a few), each in the order
//! its receipts finished: within a lane, that is also the order they expire. Expiry takes the lane
//! front that expires first; a full store takes the one that finished first. Both are a pop from the
//! front of a queue, touching memory in the order it was written (a heap of expiry times, as before,
//! sifted through cold entries on every eviction).
//!
//! An entry names its receipt by its key digest's table hash (8 bytes, not the 32 of the digest: a
//! claim writes less, and a retained key costs less). An entry may outlive its receipt (forgotten,
//! or expired and claimed anew): whoever pops it checks that a record is still the one it names
//! (that hash, finished, with the same expiry) before removing it.

use std::collections::VecDeque;

/// Distinct `ttl`s past this share the lane of the nearest one: their receipts may then wait behind
/// longer-lived ones (memory, not correctness: a read never answers an expired record).
const MAX_LANES: usize = 16;

/// A finished receipt: when it expires, and its key digest's table hash.
pub(super) type Finished = (u64, u64);

struct Lane {
    ttl_ms: u64,
    queue: VecDeque<Finished>,
}

impl Lane {
    /// When its front receipt finished.
    fn front_finished(&self) -> Option<u64> {
        self.queue
            .front()
            .map(|(at, _)| at.saturating_sub(self.ttl_ms))
    }
}

/// A shard's finished receipts, by lane.
#[derive(Default)]
pub(super) struct Lanes {
    lanes: Vec<Lane>,
}

impl Lanes {
    /// Notes a receipt that finished, to expire at `expires_at_ms`.
    pub(super) fn push(&mut self, ttl_ms: u64, expires_at_ms: u64, hash: u64) {
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
        self.lanes[lane].queue.push_back((expires_at_ms, hash));
    }

    /// Takes the receipt that expires first, if it expired by `now_ms`.
    pub(super) fn pop_expired(&mut self, now_ms: u64) -> Option<Finished> {
        let lane = self
            .lanes
            .iter_mut()
            .filter(|l| l.queue.front().is_some_and(|(at, _)| *at <= now_ms))
            .min_by_key(|l| l.queue.front().map(|(at, _)| *at))?;
        lane.queue.pop_front()
    }

    /// When the receipt that finished first finished (or an entry it outlived: a hint).
    pub(super) fn oldest(&self) -> Option<u64> {
        self.lanes.iter().filter_map(Lane::front_finished).min()
    }

    /// Takes the receipt that finished first.
    pub(super) fn pop_oldest(&mut self) -> Option<Finished> {
        self.lanes
            .iter_mut()
            .filter(|l| !l.queue.is_empty())
            .min_by_key(|l| l.front_finished())?
            .queue
            .pop_front()
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

    fn hash(n: u8) -> u64 {
        u64::from(n) * 0x0101_0101_0101_0101
    }

    #[test]
    fn expiry_follows_each_lane_and_the_oldest_goes_first() {
        let mut lanes = Lanes::default();
        // At t = 0..4, alternating a 10 s ttl and a 1 s ttl.
        lanes.push(10_000, 10_000, hash(0));
        lanes.push(1_000, 1_001, hash(1));
        lanes.push(10_000, 10_002, hash(2));
        lanes.push(1_000, 1_003, hash(3));
        assert_eq!(lanes.pop_expired(1_000), None);
        // The short lane expires first, behind no long-lived receipt.
        assert_eq!(lanes.pop_expired(2_000), Some((1_001, hash(1))));
        assert_eq!(lanes.pop_expired(2_000), Some((1_003, hash(3))));
        assert_eq!(lanes.pop_expired(2_000), None);
        // Full: the one that finished first goes, whatever its ttl.
        lanes.push(1_000, 1_004, hash(4));
        assert_eq!(lanes.pop_oldest(), Some((10_000, hash(0))));
        assert_eq!(lanes.pop_oldest(), Some((10_002, hash(2))));
        assert_eq!(lanes.pop_oldest(), Some((1_004, hash(4))));
        assert_eq!(lanes.pop_oldest(), None);
        assert_eq!(lanes.len(), 0);
    }

    #[test]
    fn ttls_past_the_lanes_share_the_nearest() {
        let mut lanes = Lanes::default();
        for ttl in 0..MAX_LANES as u64 + 4 {
            lanes.push(1_000 * (ttl + 1), 1_000 * (ttl + 1), hash(ttl as u8));
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
