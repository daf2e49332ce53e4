//! A shard's records: kept side by side in one array of slots, found by their key's digest through a
//! table of slot numbers.
//!
//! A record stays in its slot from its claim until it goes, and the slot a record leaves is the next
//! one filled. A bounded store at steady state evicts a shard's oldest finished record to make room
//! for a new key of the same shard, so the new record takes the slot of the one it replaced, and the
//! shard's slots go in the order they were filled: an eviction reads the slot after the last one,
//! usually in the same memory page, and the shard asks for it ahead ([`Records::prefetch`]). Records
//! in boxes of their own (as before) were spread over the whole heap, one page and one cache miss
//! after another for every record evicted.
//!
//! A shard reuses the room its records leave; the room a burst filled stays until a purge
//! ([`Records::give_back_room`]) finds it empty.
//!
//! The table holds 4 bytes per record (a slot number), so all of them stay in the cache; a probe
//! reads a slot only where the table's own hash bits already match.

use hashbrown::HashTable;

use super::{Digest, Entry};
use crate::call_id::CallId;
use crate::receipt::Fence;

/// The table's hash of a digest: its first 8 bytes (SHA-256 output: already uniform).
pub(super) fn hash(digest: &Digest) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(word)
}

/// Where a record is in its shard's slots (fewer than 2³² records a shard).
pub(super) type Slot = u32;

/// Slots are allocated this many at a time (about 22 KiB): a growing shard's unused room is at most
/// one chunk, and it never moves its records.
const CHUNK: usize = 64;

/// A shard's slots, in chunks.
#[derive(Default)]
struct Slots {
    chunks: Vec<Box<[Option<Entry>]>>,
    /// Slots ever filled: the next new one.
    used: usize,
}

impl Slots {
    fn place(&self, slot: Slot) -> Option<&Option<Entry>> {
        let slot = slot as usize;
        self.chunks.get(slot / CHUNK)?.get(slot % CHUNK)
    }

    fn place_mut(&mut self, slot: Slot) -> Option<&mut Option<Entry>> {
        let slot = slot as usize;
        self.chunks.get_mut(slot / CHUNK)?.get_mut(slot % CHUNK)
    }

    /// The record in `slot`, if any.
    fn at(&self, slot: Slot) -> Option<&Entry> {
        self.place(slot)?.as_ref()
    }

    /// The table's hash of the record in `slot` (0 for an empty slot, which the table never names).
    fn hash_at(&self, slot: Slot) -> u64 {
        self.at(slot).map_or(0, |e| hash(e.head.key.digest()))
    }

    /// Whether the record in `slot` is `digest`'s.
    fn holds(&self, slot: Slot, digest: &Digest) -> bool {
        self.at(slot).is_some_and(|e| e.head.key.digest() == digest)
    }

    /// A slot never filled before.
    fn fresh(&mut self) -> Slot {
        if self.used == self.chunks.len() * CHUNK {
            self.chunks.push((0..CHUNK).map(|_| None).collect());
        }
        self.used += 1;
        // A shard holds fewer than 2³² records (each is a few hundred bytes).
        (self.used - 1) as Slot
    }
}

#[derive(Default)]
pub(super) struct Records {
    slots: Slots,
    /// Empty slots, the last emptied on top.
    free: Vec<Slot>,
    table: HashTable<Slot>,
}

impl Records {
    fn find(&self, digest: &Digest) -> Option<Slot> {
        let slots = &self.slots;
        self.table
            .find(hash(digest), |&s| slots.holds(s, digest))
            .copied()
    }

    pub(super) fn get(&self, digest: &Digest) -> Option<&Entry> {
        self.slots.at(self.find(digest)?)
    }

    pub(super) fn get_mut(&mut self, digest: &Digest) -> Option<&mut Entry> {
        self.get_mut_at(digest).map(|(_, entry)| entry)
    }

    /// [`Records::get_mut`], and the record's slot (what a lane entry names it by).
    pub(super) fn get_mut_at(&mut self, digest: &Digest) -> Option<(Slot, &mut Entry)> {
        let slot = self.find(digest)?;
        Some((slot, self.slots.place_mut(slot)?.as_mut()?))
    }

    /// The record `call_id` claimed, among those whose digest hashes to `hashed`.
    pub(super) fn of_call(&self, hashed: u64, call_id: &CallId) -> Option<&Entry> {
        let slots = &self.slots;
        let slot = self.table.find(hashed, |&s| {
            slots
                .at(s)
                .is_some_and(|e| hash(e.head.key.digest()) == hashed && &e.head.call_id == call_id)
        })?;
        slots.at(*slot)
    }

    /// Adds a record whose key the table does not hold (the caller looked), in the slot emptied
    /// last; returns its slot.
    pub(super) fn insert_new(&mut self, entry: Entry) -> Slot {
        let hashed = hash(entry.head.key.digest());
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => self.slots.fresh(),
        };
        if let Some(place) = self.slots.place_mut(slot) {
            *place = Some(entry);
        }
        let slots = &self.slots;
        self.table
            .insert_unique(hashed, slot, |&s| slots.hash_at(s));
        slot
    }

    /// Empties `slot` (which the table no longer names).
    fn take(&mut self, slot: Slot) -> Option<Entry> {
        let entry = self.slots.place_mut(slot)?.take();
        if entry.is_some() {
            self.free.push(slot);
        }
        entry
    }

    pub(super) fn remove(&mut self, digest: &Digest) -> Option<Entry> {
        let slots = &self.slots;
        let (slot, _) = self
            .table
            .find_entry(hash(digest), |&s| slots.holds(s, digest))
            .ok()?
            .remove();
        self.take(slot)
    }

    /// Removes the finished record that a lane entry names: the version `fence` of the record in
    /// `slot`. `None` when that version went or changed since (forgotten, expired and claimed anew,
    /// reopened): each claim and take-over of a shard's keys gets a fence of its own.
    pub(super) fn remove_finished(&mut self, slot: Slot, fence: Fence) -> Option<Entry> {
        let hashed = self
            .slots
            .at(slot)
            .filter(|e| e.head.fence == fence && e.head.state.is_terminal())
            .map(|e| hash(e.head.key.digest()))?;
        self.table.find_entry(hashed, |&s| s == slot).ok()?.remove();
        self.take(slot)
    }

    /// Asks the CPU to bring the record in `slot` into the cache, and the outcome it holds if the
    /// slot is already there: a hint, for the record the next eviction will read.
    pub(super) fn prefetch(&self, slot: Slot) {
        if let Some(place) = self.slots.place(slot) {
            prefetch_lines(std::ptr::from_ref(place).cast(), size_of::<Option<Entry>>());
        }
    }

    /// Asks the CPU to bring the outcome the record in `slot` holds into the cache (the record
    /// itself was asked for before: reading it now should not wait).
    pub(super) fn prefetch_outcome(&self, slot: Slot) {
        if let Some(allocation) = self.slots.at(slot).and_then(|e| e.outcome.allocation()) {
            prefetch_lines(allocation, 1);
        }
    }

    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    /// Gives back the room that records no longer fill: the chunks at the end that hold none (all of
    /// them when the shard is empty), and the table's room beyond what it holds. The free slots left
    /// are then filled lowest first, so that a later call gives back what a burst left at the end.
    pub(super) fn give_back_room(&mut self) {
        let chunks = &mut self.slots.chunks;
        while chunks.last().is_some_and(|c| c.iter().all(Option::is_none)) {
            chunks.pop();
        }
        chunks.shrink_to_fit();
        let end = chunks.len() * CHUNK;
        if self.slots.used > end {
            self.slots.used = end;
            self.free.retain(|&s| (s as usize) < end);
        }
        // Popped from the end: the lowest last.
        self.free.sort_unstable_by(|a, b| b.cmp(a));
        self.free.shrink_to_fit();
        let slots = &self.slots;
        self.table.shrink_to_fit(|&s| slots.hash_at(s));
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Entry> {
        self.slots.chunks.iter().flat_map(|c| c.iter().flatten())
    }
}

/// Asks the CPU to load the cache lines of `len` bytes from `start` (nothing on other targets).
#[inline]
fn prefetch_lines(start: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        for offset in (0..len.max(1)).step_by(64) {
            // SAFETY: a prefetch changes no state the program can see and never faults, whatever
            // the address; SSE, which it needs, is part of every x86-64. `start` points into a live
            // allocation of at least `len` bytes (only the hint's usefulness depends on it).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(offset).cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (start, len);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call_id::ShortLabel;
    use crate::key::Key;
    use crate::receipt::{Fence, Receipt, ReceiptState};

    fn record(n: u64, state: ReceiptState, expires_at_ms: Option<u64>) -> Entry {
        let label = ShortLabel::from_static("t");
        Entry {
            head: Receipt {
                key: Key::build("records", &n),
                call_id: CallId::generate_at(label.clone(), label, 1_000),
                state,
                fence: Fence(n + 1),
                lease_until_ms: None,
                expires_at_ms,
                fingerprint: None,
                outcome: None,
                created_ms: 1_000,
                updated_ms: 1_000,
            },
            outcome: super::super::Outcome::None,
            waiters: None,
            kept: None,
        }
    }

    /// The state of the record `remove_finished` took.
    fn taken(records: &mut Records, slot: Slot, fence: Fence) -> Option<ReceiptState> {
        records.remove_finished(slot, fence).map(|e| e.head.state)
    }

    fn digest(n: u64) -> Digest {
        *Key::build("records", &n).digest()
    }

    impl Records {
        /// Checks what the slots, the free list and the table must agree on; `Err` says what not.
        pub(in crate::store::memory) fn check_consistent(&self) -> Result<(), String> {
            let used = self.slots.used;
            let mut seen = vec![false; used];
            for &s in &self.free {
                let s = s as usize;
                if s >= used {
                    return Err(format!("free slot {s} never used ({used} used)"));
                }
                if std::mem::replace(&mut seen[s], true) {
                    return Err(format!("slot {s} twice on the free list"));
                }
                if self.slots.at(s as Slot).is_some() {
                    return Err(format!("free slot {s} holds a record"));
                }
            }
            let mut filled = 0;
            for (s, &free) in seen.iter().enumerate() {
                match self.slots.at(s as Slot) {
                    Some(e) => {
                        filled += 1;
                        if self.find(e.head.key.digest()) != Some(s as Slot) {
                            return Err(format!("the record in slot {s} is not found there"));
                        }
                        if e.head.outcome.is_some() {
                            return Err(format!(
                                "the record in slot {s} keeps an outcome in its head"
                            ));
                        }
                    }
                    None if !free => {
                        return Err(format!("slot {s} empty and not on the free list"));
                    }
                    None => {}
                }
            }
            if filled != self.table.len() || self.values().count() != filled {
                return Err(format!(
                    "{filled} records filled, {} in the table, {} listed",
                    self.table.len(),
                    self.values().count()
                ));
            }
            Ok(())
        }

        /// The records and the slot of each.
        pub(in crate::store::memory) fn slotted(&self) -> impl Iterator<Item = (Slot, &Entry)> {
            self.slots
                .chunks
                .iter()
                .flat_map(|c| c.iter())
                .enumerate()
                .filter_map(|(s, e)| Some((s as Slot, e.as_ref()?)))
        }

        /// Slots the shard keeps room for (filled or not), and how many of them hold a record.
        pub(in crate::store::memory) fn room(&self) -> (usize, usize) {
            (self.slots.chunks.len() * CHUNK, self.table.len())
        }
    }

    #[test]
    fn a_record_leaving_hands_its_slot_to_the_next_one() {
        let mut records = Records::default();
        let slots: Vec<Slot> = (0..3)
            .map(|n| records.insert_new(record(n, ReceiptState::Processing, None)))
            .collect();
        assert_eq!(slots, [0, 1, 2]);
        assert_eq!(records.find(&digest(1)), Some(1));
        assert!(records.remove(&digest(1)).is_some());
        assert!(records.get(&digest(1)).is_none());
        assert_eq!(
            records.insert_new(record(3, ReceiptState::Processing, None)),
            1
        );
        assert_eq!(
            records.insert_new(record(4, ReceiptState::Processing, None)),
            3
        );
        assert_eq!(records.len(), 4);
        for n in [0, 2, 3, 4] {
            assert_eq!(
                records.get(&digest(n)).map(|e| e.head.key.digest()),
                Some(&digest(n))
            );
        }
    }

    #[test]
    fn records_past_a_chunk_are_all_found_and_listed() {
        let mut records = Records::default();
        let many = 3 * CHUNK as u64 + 5;
        for n in 0..many {
            records.insert_new(record(n, ReceiptState::Processing, None));
        }
        assert_eq!(records.len(), many as usize);
        assert_eq!(records.values().count(), many as usize);
        assert!((0..many).all(|n| records.get(&digest(n)).is_some()));
        let call_id = records.get(&digest(7)).map(|e| e.head.call_id.clone());
        let found = call_id.and_then(|c| records.of_call(hash(&digest(7)), &c));
        assert_eq!(found.map(|e| e.head.key.digest()), Some(&digest(7)));
        assert_eq!(records.find(&digest(7)), Some(7));
    }

    #[test]
    fn a_lane_entry_takes_only_the_version_of_the_record_it_names() {
        let mut records = Records::default();
        let slot = records.insert_new(record(0, ReceiptState::Success, Some(5_000)));
        let fence = Fence(1);
        // Another fence, another slot: not the record named.
        assert_eq!(taken(&mut records, slot, Fence(2)), None);
        assert_eq!(taken(&mut records, slot + 1, fence), None);
        // Back in flight (reopened under a new fence, or this one): not a finished record.
        if let Some(entry) = records.get_mut(&digest(0)) {
            entry.head.state = ReceiptState::Processing;
        }
        assert_eq!(taken(&mut records, slot, fence), None);
        // Forgotten, and the slot refilled by another key: the old entry takes nothing.
        assert!(records.remove(&digest(0)).is_some());
        assert_eq!(
            records.insert_new(record(1, ReceiptState::Success, Some(5_000))),
            slot
        );
        assert_eq!(taken(&mut records, slot, fence), None);
        assert!(records.get(&digest(1)).is_some());
        // The version it names goes, and its slot is free again.
        let other = records.insert_new(record(2, ReceiptState::Failed, Some(6_000)));
        assert_eq!(
            taken(&mut records, other, Fence(3)),
            Some(ReceiptState::Failed)
        );
        assert!(records.get(&digest(2)).is_none());
        assert_eq!(records.len(), 1);
        assert_eq!(
            records.insert_new(record(3, ReceiptState::Processing, None)),
            other
        );
    }

    #[test]
    fn a_record_with_a_short_outcome_takes_at_most_six_cache_lines() {
        // What the store's documentation states (about 350 bytes), and what an eviction reads.
        assert!(size_of::<Option<Entry>>() <= 6 * 64);
    }
}
