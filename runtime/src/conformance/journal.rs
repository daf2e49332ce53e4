//! The journal contract: a key's events are kept in the order they were appended, read by key and by
//! callId, bounded to the latest [`JOURNAL_LIMIT`], for as long as the key's record lives (and at least
//! the `keep_ms` of the latest append); the keys that have a journal are listed.

use std::sync::Arc;

use super::support::{acquire, call, fresh_key, note, success, Timeline, PURGE_T0, T0};
use crate::journal::{Event, JOURNAL_LIMIT};
use crate::key::Key;
use crate::store::Store;

/// The keys that have a journal are listed in digest order, paged; a key with no journal is not.
pub async fn journaled_keys_are_listed(store: Arc<dyn Store>) {
    let mut keys: Vec<Key> = (0..5)
        .map(|i| fresh_key(&format!("journaled-{i}")))
        .collect();
    for key in &keys {
        store
            .append_journal(key, &[note(&call(), 1)], 60_000, T0)
            .await
            .expect("append");
    }
    let silent = fresh_key("journaled-none");
    acquire(&*store, &silent, &call(), T0).await;
    keys.sort_by_key(|k| *k.digest());
    // Other tests share the store: walk every page, keep the keys of this test.
    let (mut after, mut seen) = (None, Vec::new());
    loop {
        let page = store.journaled_keys(after, 2).await.expect("list");
        assert!(page.len() <= 2, "a page holds at most its limit");
        let Some(last) = page.last() else { break };
        after = Some(*last.digest());
        seen.extend(page.iter().map(|k| *k.digest()));
    }
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "in digest order, once each"
    );
    let mine: Vec<[u8; 32]> = seen
        .into_iter()
        .filter(|d| keys.iter().any(|k| k.digest() == d) || d == silent.digest())
        .collect();
    let want: Vec<[u8; 32]> = keys.iter().map(|k| *k.digest()).collect();
    assert_eq!(
        mine, want,
        "every journaled key, and no key without a journal"
    );
}

/// The journal keeps a key's events in the order they were appended, readable by key and by callId,
/// bounded to the latest [`JOURNAL_LIMIT`]; a callId nobody journaled has no events.
pub async fn journal_is_kept_in_order(store: Arc<dyn Store>) {
    let key = fresh_key("journal");
    let first = call();
    let fence = acquire(&*store, &key, &first, T0).await;
    let events: Vec<Event> = (1..=3).map(|n| note(&first, n)).collect();
    store
        .append_journal(&key, &events[..2], 60_000, T0)
        .await
        .expect("append");
    store
        .append_journal(&key, &events[2..], 60_000, T0)
        .await
        .expect("append");
    store
        .append_journal(&key, &[], 60_000, T0)
        .await
        .expect("an empty append changes nothing");
    assert_eq!(store.journal(&key, T0).await.expect("journal"), events);
    assert_eq!(
        store.journal_of_call(&first, T0).await.expect("journal"),
        events,
        "a call in flight is read by its callId"
    );
    assert_eq!(
        store.journal_of_call(&call(), T0).await.expect("journal"),
        Vec::new(),
        "a callId nobody journaled has no events"
    );
    // A second call on the key after the first gave it back: the key's journal holds both, each
    // callId its own.
    store.release(&key, fence).await.expect("release");
    let second = call();
    acquire(&*store, &key, &second, T0).await;
    store
        .append_journal(&key, &[note(&second, 4)], 60_000, T0)
        .await
        .expect("append");
    let both = store.journal(&key, T0).await.expect("journal");
    assert_eq!(both.len(), 4);
    assert_eq!(both[3].call_id, second);
    assert_eq!(
        store.journal_of_call(&first, T0).await.expect("journal"),
        events,
        "a call given back is still read by its callId"
    );
    assert_eq!(
        store.journal_of_call(&second, T0).await.expect("journal"),
        vec![note(&second, 4)]
    );
    // Bounded: the latest events are kept.
    let many: Vec<Event> = (10..10 + JOURNAL_LIMIT as u64 + 5)
        .map(|n| note(&second, n))
        .collect();
    store
        .append_journal(&key, &many[..10], 60_000, T0)
        .await
        .expect("append");
    store
        .append_journal(&key, &many[10..], 60_000, T0)
        .await
        .expect("append");
    let kept = store.journal(&key, T0).await.expect("journal");
    assert_eq!(kept.len(), JOURNAL_LIMIT, "a key keeps its latest events");
    assert_eq!(kept[..], many[many.len() - JOURNAL_LIMIT..]);
}

/// A key's journal lives as long as its record — a claim without expiry outlives the `keep_ms` of
/// its events, a finished record keeps them until it expires — and at least `keep_ms` after the
/// latest append, also once the record is given back; a purge keeps both.
pub async fn journal_lives_with_its_record(store: Arc<dyn Store>) {
    let mut time = Timeline::of(&*store, PURGE_T0).await;
    let key = fresh_key("journal-life");
    let me = call();
    let fence = acquire(&*store, &key, &me, time.now).await;
    store
        .append_journal(&key, &[note(&me, 1)], 100, time.now)
        .await
        .expect("append");
    time.pass(250).await;
    store.purge_expired(time.now).await.expect("purge");
    assert_eq!(
        store.journal(&key, time.now).await.expect("journal").len(),
        1,
        "a call in flight keeps its journal past keep_ms"
    );
    store
        .complete(&key, fence, success(b"1", 5_000), time.now)
        .await
        .expect("complete");
    time.pass(150).await;
    store.purge_expired(time.now).await.expect("purge");
    assert_eq!(
        store
            .journal_of_call(&me, time.now)
            .await
            .expect("journal")
            .len(),
        1,
        "a finished record keeps its journal until it expires"
    );
    // Given back: kept for keep_ms after the latest append.
    let released = fresh_key("journal-released");
    let gone = call();
    let fence = acquire(&*store, &released, &gone, time.now).await;
    store.release(&released, fence).await.expect("release");
    store
        .append_journal(&released, &[note(&gone, 2)], 5_000, time.now)
        .await
        .expect("append");
    time.pass(100).await;
    store.purge_expired(time.now).await.expect("purge");
    assert_eq!(
        store
            .journal_of_call(&gone, time.now)
            .await
            .expect("journal"),
        vec![note(&gone, 2)],
        "a call given back keeps its journal for keep_ms"
    );
}
