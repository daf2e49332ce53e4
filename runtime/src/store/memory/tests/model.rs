//! The store checked against a model of its records, step by step under seeded orderings, and the
//! orderings that reusing a record's slot opens: a slot refilled under a stale lane entry, a reopen,
//! two keys sharing their table hash, the room a burst leaves.

use super::*;

/// Whether each shard's slots, free list and table agree, the bounded count is the records
/// held, and every finished record with an expiry has a lane entry that names it (without one,
/// it would never go: neither at its expiry nor to make room).
fn check_store(store: &MemoryStore) -> Result<(), String> {
    let mut total = 0;
    for (i, shard) in store.shards.iter().enumerate() {
        let shard = lock(shard);
        shard
            .records
            .check_consistent()
            .map_err(|e| format!("shard {i}: {e}"))?;
        total += shard.records.len();
        for (slot, e) in shard.records.slotted() {
            if let (true, Some(at)) = (e.head.state.is_terminal(), e.head.expires_at_ms) {
                let named = finished::Finished {
                    at,
                    fence: e.head.fence,
                    slot,
                };
                if !shard.finished.holds(named) {
                    return Err(format!(
                        "shard {i}: the finished record in slot {slot} has no lane entry: it never goes"
                    ));
                }
            }
        }
    }
    if store.bounded_store() {
        let held = store.held.load(std::sync::atomic::Ordering::Acquire);
        if held != total {
            return Err(format!("held {held} while {total} records are held"));
        }
        if total > store.capacity {
            return Err(format!("{total} records in a store of {}", store.capacity));
        }
    }
    Ok(())
}

/// Lane entries that name a slot now holding a record they do not name (another key, or the same
/// key anew).
fn stale_entries_under_new_records(store: &MemoryStore) -> usize {
    store
        .shards
        .iter()
        .map(|shard| {
            let shard = lock(shard);
            shard
                .records
                .slotted()
                .filter(|(slot, e)| {
                    shard
                        .finished
                        .names_slot(*slot, |f| f.fence != e.head.fence)
                })
                .count()
        })
        .sum()
}

#[derive(Clone, Debug)]
struct Model {
    call_id: CallId,
    state: ReceiptState,
    fence: Fence,
    outcome: Option<Vec<u8>>,
    expires: Option<u64>,
    lease_until: Option<u64>,
}

/// A seeded walk over a few keys of two shards of a bounded store (claims, completions with
/// outcomes of every length around the inline bound, reopens, take-overs, `UNKNOWN`s, releases,
/// forgets, expiries, purges), slots freed and refilled all along, checked against a model after
/// every step: a record the store answers is exactly the model's (outcome byte for byte, by key
/// and by callId, `read_success` included); only a finished record ever goes unasked; the slots,
/// the table, the lanes and the bounded count never drift.
#[test]
fn holds_slots_refilled_in_any_order_never_answer_another_record() {
    let mut seen = [0usize; 5];
    for seed in 1..=48u64 {
        let s = walk(seed, 3_000);
        for (total, n) in seen.iter_mut().zip(s) {
            *total += n;
        }
    }
    // Reopens, refusals of a full store, finished records gone unasked, slots refilled under
    // a stale lane entry, and outcomes within one byte of the inline bound: all were walked.
    assert!(seen.iter().all(|&n| n > 50), "{seen:?}");
}

fn walk(seed: u64, steps: usize) -> [usize; 5] {
    let mut seen = [0usize; 5];
    let store = MemoryStore::with_capacity(7);
    let mut keys = same_shard("walk-a", 6);
    keys.extend(same_shard("walk-b", 4));
    let mut model: Vec<Option<Model>> = vec![None; keys.len()];
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let lens = [0usize, 1, 61, 62, 63, 64, 200];
    let mut now = 1_000u64;
    let mut calls = 0u64;
    for step in 0..steps {
        now += next(8);
        let k = next(keys.len() as u64) as usize;
        let key = &keys[k];
        let ctx = format!("seed {seed} step {step} key {k} at {now}");
        let op = next(100);
        match op {
            0..=29 => {
                calls += 1;
                let call_id = CallId::new("walk", &format!("c{calls}")).unwrap();
                let got = store.claim_now(Claim {
                    key: key.clone(),
                    call_id: call_id.clone(),
                    fingerprint: None,
                    lease_ms: 40,
                    now_ms: now,
                });
                match got {
                    Ok(Claimed::Acquired(fence)) => {
                        if let Some(m) = &model[k] {
                            let gone_ok = m.state.is_terminal();
                            assert!(gone_ok, "{ctx}: claimed over a live {m:?}");
                        }
                        model[k] = Some(Model {
                            call_id,
                            state: ReceiptState::Processing,
                            fence,
                            outcome: None,
                            expires: None,
                            lease_until: Some(now + 40),
                        });
                    }
                    Ok(Claimed::Existing(r)) => {
                        let m = model[k].as_ref().unwrap_or_else(|| {
                            panic!("{ctx}: Existing {r:?} for a key the model holds nothing of")
                        });
                        same(&ctx, &r, m);
                    }
                    Err(StoreError::Full { .. }) => {
                        seen[1] += 1;
                        for shard in store.shards.iter() {
                            let shard = lock(shard);
                            for e in shard.records.values() {
                                assert!(
                                    !e.head.state.is_terminal(),
                                    "{ctx}: Full while a finished record could go"
                                );
                            }
                        }
                    }
                    Err(e) => panic!("{ctx}: claim: {e:?}"),
                }
            }
            30..=49 => {
                let Some(m) = model[k].as_mut() else { continue };
                if m.state.is_terminal() {
                    continue;
                }
                let state = if next(2) == 0 {
                    ReceiptState::Success
                } else {
                    ReceiptState::Failed
                };
                let outcome = (next(8) != 0).then(|| {
                    let len = lens[next(lens.len() as u64) as usize];
                    (0..len)
                        .map(|i| (i as u64 ^ step as u64) as u8)
                        .collect::<Vec<u8>>()
                });
                let ttl = [5u64, 30, 200][next(3) as usize];
                let completion = Completion {
                    state,
                    outcome: outcome.clone().map(Arc::from),
                    ttl_ms: ttl,
                };
                seen[4] += usize::from(
                    outcome
                        .as_ref()
                        .is_some_and(|o| (61..=63).contains(&o.len())),
                );
                let t = store.complete_now(key, m.fence, completion, now);
                assert_eq!(t, Ok(Transition::Applied), "{ctx}: complete {m:?}");
                m.state = state;
                m.outcome = outcome;
                m.expires = Some(now + ttl);
                m.lease_until = None;
            }
            50..=59 => {
                let Some(m) = model[k].as_mut() else { continue };
                let reopen = m.state.is_terminal();
                if reopen && m.expires.is_some_and(|e| e <= now) {
                    continue;
                }
                let got = store.take_over_now(key, m.fence, 40, now, reopen);
                let open = match m.state {
                    ReceiptState::Unknown => true,
                    ReceiptState::Processing => m.lease_until.is_some_and(|l| l <= now),
                    _ => true,
                };
                match got {
                    Ok(Claimed::Acquired(fence)) if open => {
                        assert!(fence > m.fence, "{ctx}");
                        seen[0] += usize::from(reopen);
                        m.fence = fence;
                        m.state = ReceiptState::Processing;
                        m.outcome = None;
                        m.expires = None;
                        m.lease_until = Some(now + 40);
                    }
                    Ok(Claimed::Existing(r)) if !open => same(&ctx, &r, m),
                    // A finished record a full store evicted meanwhile.
                    Err(StoreError::NotFound) if m.state.is_terminal() => model[k] = None,
                    other => panic!("{ctx}: take-over of {m:?}: {other:?}"),
                }
            }
            60..=64 => {
                let Some(m) = model[k].as_mut() else { continue };
                if m.state != ReceiptState::Processing {
                    continue;
                }
                let t = store.mark_unknown_now(key, m.fence, now);
                assert_eq!(t, Ok(Transition::Applied), "{ctx}");
                m.state = ReceiptState::Unknown;
                m.lease_until = None;
            }
            65..=71 => {
                let Some(m) = model[k].as_ref() else { continue };
                if m.state != ReceiptState::Processing {
                    continue;
                }
                assert_eq!(store.release_now(key, m.fence), Ok(()), "{ctx}");
                model[k] = None;
            }
            72..=79 => {
                let Some(m) = model[k].as_ref() else { continue };
                if !m.state.is_terminal() {
                    continue;
                }
                match store.forget_now(key, m.fence) {
                    Ok(()) | Err(StoreError::NotFound) => model[k] = None,
                    other => panic!("{ctx}: forget {m:?}: {other:?}"),
                }
            }
            80..=83 => {
                store.purge_expired_now(now).unwrap();
            }
            _ => {}
        }
        if let Err(e) = check_store(&store) {
            panic!("{ctx} after op {op}: {e}");
        }
        seen[3] += stale_entries_under_new_records(&store);
        // Every key, read every way.
        for (j, key) in keys.iter().enumerate() {
            let ctx = format!("{ctx}, reading key {j}");
            let got = store.get_now(key, now).unwrap();
            match (&got, &model[j]) {
                (Some(r), Some(m)) => {
                    same(&ctx, r, m);
                    let by_call = store.get_by_call_id_now(&m.call_id).unwrap();
                    assert_eq!(by_call.as_ref(), Some(r), "{ctx}: by callId");
                    let read = store.read_success(key, now, |_, bytes, _| Some(bytes.to_vec()));
                    if m.state == ReceiptState::Success {
                        assert_eq!(read, m.outcome, "{ctx}: read_success");
                    } else {
                        assert_eq!(read, None, "{ctx}: read_success of a {:?}", m.state);
                    }
                }
                (None, Some(m)) => {
                    assert!(
                        m.state.is_terminal(),
                        "{ctx}: a {:?} record went: {m:?}",
                        m.state
                    );
                    if m.expires.is_none_or(|e| e > now) {
                        // Evicted to make room: only ever a finished one, checked above.
                        seen[2] += 1;
                    }
                    model[j] = None;
                }
                (Some(r), None) => panic!("{ctx}: a record the model does not hold: {r:?}"),
                (None, None) => {}
            }
        }
    }
    seen
}

fn same(ctx: &str, r: &Receipt, m: &Model) {
    assert_eq!(r.call_id, m.call_id, "{ctx}: callId");
    assert_eq!(r.state, m.state, "{ctx}: state");
    assert_eq!(r.fence, m.fence, "{ctx}: fence");
    assert_eq!(r.outcome.as_deref(), m.outcome.as_deref(), "{ctx}: outcome");
    assert_eq!(r.expires_at_ms, m.expires, "{ctx}: expiry");
}

/// What a burst leaves behind: 100 000 keys claimed and finished with a short ttl, then all
/// purged. The store is empty, and the purge gives back the room they filled (at most a chunk of
/// 64 slots a shard stays).
#[test]
fn a_purge_gives_back_the_room_a_burst_filled() {
    let store = MemoryStore::new();
    let slot = size_of::<Option<Entry>>();
    for i in 0..100_000u64 {
        let key = Key::build("burst", &i);
        let fence = acquired(claim(&store, &key, 1_000));
        finish(&store, &key, fence, 1_000, 10);
    }
    store.purge_expired_now(u64::MAX).unwrap();
    assert!(store.is_empty());
    let room: usize = store.shards.iter().map(|s| lock(s).records.room().0).sum();
    let retained = room * slot;
    assert!(
        retained <= SHARDS * 64 * slot,
        "an empty store still holds {room} slots of {slot} bytes: {} MiB kept after a burst",
        retained >> 20
    );
}

/// `read_success` keeps a decoded copy beside a `SUCCESS` record. A reopen drops it and the old
/// outcome: the reopened record reads as nothing to replay, and once it succeeds again the new
/// outcome is read, with no copy of the old one; nor does a record that takes the slot of a
/// forgotten one find that one's copy.
#[test]
fn holds_a_reopen_or_a_refilled_slot_never_replays_an_old_decoded_copy() {
    let store = MemoryStore::new();
    let keys = same_shard("kept", 2);
    let read = |key: &Key, now| {
        store.read_success(key, now, |_, bytes, kept| {
            let old = kept
                .as_ref()
                .and_then(|k| k.downcast_ref::<Vec<u8>>().cloned());
            if kept.is_none() {
                *kept = Some(Arc::new(bytes.to_vec()));
            }
            Some((bytes.to_vec(), old))
        })
    };
    let complete = |key: &Key, fence, outcome: &[u8], now| {
        let completion = Completion {
            state: ReceiptState::Success,
            outcome: Some(Arc::from(outcome)),
            ttl_ms: 60_000,
        };
        store.complete_now(key, fence, completion, now).unwrap();
    };
    let key = &keys[0];
    let first = acquired(claim(&store, key, 10));
    complete(key, first, &[b'a'; 62], 10);
    assert_eq!(read(key, 11), Some((vec![b'a'; 62], None)));
    assert_eq!(read(key, 12), Some((vec![b'a'; 62], Some(vec![b'a'; 62]))));
    let Ok(Claimed::Acquired(second)) = store.take_over_now(key, first, 1_000, 20, true) else {
        panic!("reopened")
    };
    assert_eq!(read(key, 21), None, "a reopened record replays nothing");
    complete(key, second, &[b'b'; 63], 30);
    assert_eq!(read(key, 31), Some((vec![b'b'; 63], None)));
    assert_eq!(read(key, 32), Some((vec![b'b'; 63], Some(vec![b'b'; 63]))));
    // Forgotten; the other key takes its slot and succeeds with an empty outcome.
    store.forget_now(key, second).unwrap();
    let other = &keys[1];
    let f = acquired(claim(&store, other, 40));
    assert_eq!(
        lock(&store.shards[shard_index(other.digest())])
            .records
            .get_mut_at(other.digest())
            .map(|(slot, _)| slot),
        Some(0)
    );
    complete(other, f, b"", 40);
    assert_eq!(read(other, 41), Some((vec![], None)));
    assert_eq!(read(key, 41), None);
}
