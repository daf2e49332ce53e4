//! The callId index of one slice of callIds: which key a callId claimed, by where its record is (its
//! shard and its digest's table hash: 9 bytes where the digest is 32).
//!
//! Indexed by the callId's time and 64 random bits (16 bytes) rather than by the whole callId (88
//! bytes, and two label comparisons per probe). Two callIds that share those 16 bytes (the same callId
//! adopted by two keys, or a collision of the random bits within one millisecond) are told apart by an
//! overflow map keyed by the whole callId, empty in practice. A reader checks the record it finds
//! against the callId it asked for.
//!
//! Claims come in the order their callIds were made, and a bounded or expiring store lets the oldest
//! receipts go first: the index is a queue in the order of the callIds' milliseconds, appended at the
//! back and emptied from the front, so that a claim and an eviction touch its two ends (in the cache)
//! instead of a random slot of a hash table each (a miss each, at 10⁵ receipts). A callId older than
//! the newest one indexed (adopted from an inbound request, made before a claim that overtook it, a
//! clock stepped back) goes to a map beside it. A removal from the middle (a key given back, another
//! `ttl`) leaves a hole, dropped when it reaches the front or when holes are half the queue. A lookup
//! by callId is a binary search to its millisecond, then a scan of the claims made in it.

use std::collections::VecDeque;

use super::{records, shard_index, Digest, FastMap};
use crate::call_id::CallId;

/// Where a claimed key's record is: its shard, and its digest's hash in the shard's table. A reader
/// looks there for the record of the callId it asked for (two records of a shard may share a hash).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Place {
    pub(super) shard: u8,
    pub(super) hash: u64,
}

impl Place {
    pub(super) fn of(digest: &Digest) -> Place {
        Place {
            // Fewer than 256 shards.
            shard: shard_index(digest) as u8,
            hash: records::hash(digest),
        }
    }
}

/// The part of a callId the late map is keyed by: its time and random bits.
type Short = (u64, u64);

fn short(call_id: &CallId) -> Short {
    (call_id.unix_ms(), call_id.entropy())
}

/// One claim in the queue (32 bytes: `Place`'s fields laid out flat, beside the flag); not `live`
/// once removed (a hole).
struct Slot {
    ms: u64,
    entropy: u64,
    hash: u64,
    shard: u8,
    live: bool,
}

impl Slot {
    fn new((ms, entropy): Short, place: Place) -> Slot {
        Slot {
            ms,
            entropy,
            hash: place.hash,
            shard: place.shard,
            live: true,
        }
    }

    fn place(&self) -> Option<Place> {
        self.live.then_some(Place {
            shard: self.shard,
            hash: self.hash,
        })
    }

    fn is(&self, (ms, entropy): Short, place: Place) -> bool {
        self.ms == ms && self.entropy == entropy && self.place() == Some(place)
    }
}

#[derive(Default)]
pub(super) struct CallIndex {
    /// Claims in the order of their callIds' milliseconds (claims of one millisecond in the order they
    /// came). One callId on two keys (adopted by both) is two slots.
    ordered: VecDeque<Slot>,
    /// Holes in `ordered`.
    holes: usize,
    /// Claims whose callId is older than the newest in `ordered` when they came.
    late: FastMap<Short, Place>,
    /// Late callIds whose short form another key's callId took first.
    overflow: FastMap<CallId, Place>,
}

impl CallIndex {
    /// Notes that `call_id` claimed the key whose record is at `place`.
    pub(super) fn insert(&mut self, call_id: &CallId, place: Place) {
        let short = short(call_id);
        if self.ordered.back().is_none_or(|last| last.ms <= short.0) {
            self.ordered.push_back(Slot::new(short, place));
            return;
        }
        // A key is claimed only while it has no live record, so an entry already here is another
        // key's, even at the same place (two keys of a shard whose digests share a hash).
        match self.late.entry(short) {
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(place);
            }
            std::collections::hash_map::Entry::Occupied(_) => {
                self.overflow.insert(call_id.clone(), place);
            }
        }
    }

    /// Where the record of the key `call_id` claimed may be, the most likely first: check each
    /// record, since other callIds may share an entry's 16 bytes (callIds derived from one another,
    /// as a message's work's is from its producer's, share their time and random bits). Of one callId
    /// on two keys, the later claim comes first.
    pub(super) fn candidates(&self, call_id: &CallId) -> Vec<Place> {
        let (ms, entropy) = short(call_id);
        let mut places: Vec<Place> = self
            .millisecond(ms)
            .filter(|slot| slot.entropy == entropy)
            .filter_map(Slot::place)
            .collect();
        places.reverse();
        if !self.overflow.is_empty() {
            if let Some(place) = self.overflow.get(call_id) {
                places.insert(0, *place);
            }
        }
        places.extend(self.late.get(&(ms, entropy)).copied());
        places
    }

    /// Forgets that `call_id` claimed the key whose record is at `place` (the record went).
    pub(super) fn remove(&mut self, call_id: &CallId, place: Place) {
        if !self.overflow.is_empty() && self.overflow.get(call_id) == Some(&place) {
            self.overflow.remove(call_id);
            return;
        }
        let short = short(call_id);
        // What a bounded or expiring store evicts is at or near the front: found in a probe or a few,
        // and its hole dropped at once by `compact`.
        let start = self.first_at(short.0);
        let found = self
            .ordered
            .range(start..)
            .take_while(|slot| slot.ms == short.0)
            .position(|slot| slot.is(short, place));
        if let Some(i) = found.map(|at| start + at) {
            self.ordered[i].live = false;
            self.holes += 1;
            self.compact();
            return;
        }
        if self.late.get(&short) == Some(&place) {
            self.late.remove(&short);
        }
    }

    /// The claims made in millisecond `ms`, in the order they came.
    fn millisecond(&self, ms: u64) -> impl Iterator<Item = &Slot> {
        self.ordered
            .range(self.first_at(ms)..)
            .take_while(move |slot| slot.ms == ms)
    }

    /// The position of the first claim made in millisecond `ms` or later. A galloping search from the
    /// front: what a bounded or expiring store removes lies a few places behind the front, found in a
    /// few probes of memory already in the cache (a binary search over the whole queue misses it
    /// about once a probe); a claim anywhere else costs at most twice a binary search.
    fn first_at(&self, ms: u64) -> usize {
        let len = self.ordered.len();
        // Every claim before `lo` is older than `ms`; the one at `hi` (if any) is not.
        let (mut lo, mut hi) = (0, 0);
        while hi < len && self.ordered[hi].ms < ms {
            lo = hi + 1;
            hi = 2 * hi + 1;
        }
        let mut hi = hi.min(len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.ordered[mid].ms < ms {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    fn drop_front_holes(&mut self) {
        while self.ordered.front().is_some_and(|slot| !slot.live) {
            self.ordered.pop_front();
            self.holes -= 1;
        }
    }

    /// Drops the holes at the front, and all of them once they are half the queue.
    fn compact(&mut self) {
        self.drop_front_holes();
        if self.holes > 64 && self.holes * 2 > self.ordered.len() {
            self.ordered.retain(|slot| slot.live);
            self.holes = 0;
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.ordered.len() - self.holes + self.late.len() + self.overflow.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call_id::ShortLabel;

    fn at(n: u8) -> Place {
        Place {
            shard: n % 64,
            hash: u64::from(n),
        }
    }

    fn call_at(ms: u64) -> CallId {
        CallId::generate_at(
            ShortLabel::from_static("t"),
            ShortLabel::from_static("n"),
            ms,
        )
    }

    impl CallIndex {
        /// The first candidate: where `call_id`'s record is when no other callId shares its bytes.
        fn get(&self, call_id: &CallId) -> Option<Place> {
            self.candidates(call_id).first().copied()
        }
    }

    /// Two callIds that share their time and random bits (a message's work's callId, derived from
    /// its producer's): each is found among the candidates of its own lookup.
    #[test]
    fn call_ids_that_share_their_time_and_random_bits_are_both_found() {
        let mut index = CallIndex::default();
        let producer = call_at(7);
        let derived: CallId = format!("t.0-{}-{:016x}-n", producer.unix_ms(), producer.entropy())
            .parse()
            .unwrap();
        index.insert(&producer, at(1));
        index.insert(&derived, at(2));
        assert!(index.candidates(&producer).contains(&at(1)));
        assert!(index.candidates(&derived).contains(&at(2)));
    }

    #[test]
    fn one_call_id_on_two_keys_and_removals_in_any_order() {
        let mut index = CallIndex::default();
        let call = call_at(7);
        let other = call_at(7);
        index.insert(&call, at(1));
        index.insert(&other, at(3));
        // The same callId adopted by a second key: both kept.
        index.insert(&call, at(2));
        assert_eq!(index.len(), 3);
        assert_eq!(index.get(&call), Some(at(2)), "the later claim");
        assert_eq!(index.get(&other), Some(at(3)));
        index.remove(&call, at(2));
        assert_eq!(index.get(&call), Some(at(1)));
        index.remove(&call, at(1));
        assert_eq!(index.get(&call), None);
        // A removal of a record the index no longer points to changes nothing.
        index.remove(&other, at(9));
        assert_eq!(index.get(&other), Some(at(3)));
    }

    /// One late callId on two keys at the same place (their digests share a shard and a hash): each
    /// removal forgets one of them, and the other is still found until its own removal.
    #[test]
    fn one_late_call_id_on_two_keys_at_one_place() {
        let mut index = CallIndex::default();
        index.insert(&call_at(100), at(5));
        let late = call_at(7);
        index.insert(&late, at(1));
        index.insert(&late, at(1));
        assert_eq!(index.len(), 3);
        index.remove(&late, at(1));
        assert_eq!(index.get(&late), Some(at(1)), "the other key's claim");
        index.remove(&late, at(1));
        assert_eq!(index.get(&late), None);
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn the_galloping_search_finds_what_a_binary_search_finds() {
        for len in 0..70u64 {
            let mut index = CallIndex::default();
            // Milliseconds with repeats and gaps: 0, 0, 0, 3, 3, 3, 6, …
            for i in 0..len {
                index.ordered.push_back(Slot::new((i / 3 * 3, i), at(0)));
            }
            for ms in 0..=len + 1 {
                let expected = index.ordered.partition_point(|slot| slot.ms < ms);
                assert_eq!(index.first_at(ms), expected, "{len} claims, ms {ms}");
            }
        }
    }

    #[test]
    fn late_callids_holes_and_compaction_against_a_map() {
        use std::collections::HashMap;
        let mut index = CallIndex::default();
        let mut model: HashMap<String, (CallId, Place)> = HashMap::new();
        // A seeded walk: mostly in order, some late (older) callIds, removals at the front and in
        // the middle, re-claims of removed callIds.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut made: Vec<CallId> = Vec::new();
        for step in 0..20_000u64 {
            let roll = next() % 100;
            if roll < 55 || made.is_empty() {
                let ms = if roll % 10 == 0 {
                    step.saturating_sub(next() % 50)
                } else {
                    step
                };
                let call = call_at(ms);
                let place = at((next() % 251) as u8);
                index.insert(&call, place);
                model.insert(call.to_string(), (call.clone(), place));
                made.push(call);
            } else if roll < 95 {
                // Mostly the oldest still held, sometimes any.
                let pick = if roll < 80 {
                    0
                } else {
                    (next() as usize) % made.len()
                };
                let call = made.remove(pick);
                if let Some((_, place)) = model.remove(&call.to_string()) {
                    index.remove(&call, place);
                }
            } else {
                let call = &made[(next() as usize) % made.len()];
                if let Some((_, place)) = model.get(&call.to_string()) {
                    index.remove(call, *place);
                    index.insert(call, *place);
                }
            }
        }
        for (call, place) in model.values() {
            assert_eq!(index.get(call), Some(*place), "{call}");
        }
        assert_eq!(index.len(), model.len());
        assert!(
            index.holes * 2 <= index.ordered.len().max(128),
            "holes are dropped: {} of {}",
            index.holes,
            index.ordered.len()
        );
    }
}
