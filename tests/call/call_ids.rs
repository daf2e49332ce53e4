//! CallIds: unique across a million generations on several threads, and the same on every attempt
//! (see `decision_table::call_id_is_the_same_on_every_attempt`).

use std::collections::HashSet;

use samekey::{CallId, TraceId};

#[test]
fn a_million_call_ids_on_four_threads_are_unique() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 250_000;
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            std::thread::spawn(|| {
                (0..PER_THREAD)
                    .map(|_| CallId::new("ord", "node07").unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut texts = HashSet::with_capacity(THREADS * PER_THREAD);
    let mut entropies = HashSet::with_capacity(THREADS * PER_THREAD);
    for handle in handles {
        for id in handle.join().unwrap() {
            entropies.insert(id.entropy());
            texts.insert(id.to_string());
        }
    }
    assert_eq!(texts.len(), THREADS * PER_THREAD);
    assert_eq!(
        entropies.len(),
        THREADS * PER_THREAD,
        "the entropy field alone is unique"
    );
}

#[test]
fn entropy_bits_look_random() {
    // Consecutive ids must not share a visible counter: each bit of the entropy field flips about half the
    // time between neighbours.
    let ids: Vec<u64> = (0..10_000)
        .map(|_| CallId::new("ord", "n").unwrap().entropy())
        .collect();
    for bit in 0..64 {
        let flips = ids
            .windows(2)
            .filter(|w| ((w[0] ^ w[1]) >> bit) & 1 == 1)
            .count();
        assert!(
            (4_000..6_000).contains(&flips),
            "bit {bit} flipped {flips} times in 9999"
        );
    }
}

#[test]
fn trace_ids_are_unique() {
    let ids: HashSet<TraceId> = (0..100_000).map(|_| TraceId::new()).collect();
    assert_eq!(ids.len(), 100_000);
}
