//! The listings contract: receipts listed by creation time in pages without gaps or repeats, filtered
//! by scope and state, and the orphans (calls still `PROCESSING` after their owner's lease ended).

use std::sync::Arc;

use super::support::{acquire, call, claim, fresh_key, success, Timeline, T0};
use crate::call_id::TraceId;
use crate::compensation::CompensationEntry;
use crate::key::Key;
use crate::receipt::ReceiptState;
use crate::store::{Claimed, Cursor, ReceiptQuery, Store};

/// Receipts are listed by creation time in pages that follow each other without gaps or repeats,
/// filtered by scope and state; released keys and expired receipts are not listed.
pub async fn receipts_are_listed(store: Arc<dyn Store>) {
    let scope = format!("samekey.listing.{:x}", TraceId::new().as_u128());
    let mut time = Timeline::of(&*store, T0).await;
    let start = store.now_ms(time.now).await.expect("the store's time");
    let mut keys = Vec::new();
    let mut fences = Vec::new();
    for i in 0..7u32 {
        let key = Key::build(&scope, &i);
        let fence = acquire(&*store, &key, &call(), time.now).await;
        keys.push(key);
        fences.push(fence);
        time.pass(2).await;
    }
    // Two succeed, one is released (no longer a receipt), one expires soon.
    for i in [0, 1] {
        store
            .complete(&keys[i], fences[i], success(b"1", 600_000), time.now)
            .await
            .expect("complete");
    }
    store.release(&keys[2], fences[2]).await.expect("release");
    store
        .complete(&keys[3], fences[3], success(b"1", 100), time.now)
        .await
        .expect("complete");
    time.pass(300).await;
    let query = ReceiptQuery::created_between(start.saturating_sub(60_000), start + 3_600_000)
        .scope(scope.clone())
        .limit(2);
    let mut listed = Vec::new();
    let mut page_query = query.clone();
    let mut pages = 0;
    loop {
        let page = store
            .list_receipts(&page_query, time.now)
            .await
            .expect("list");
        pages += 1;
        listed.extend(page.receipts);
        match page.next {
            Some(next) => page_query = query.clone().after(next),
            None => break,
        }
        assert!(pages < 100, "pages never end");
    }
    let expected: Vec<Key> = [0, 1, 4, 5, 6].iter().map(|&i| keys[i].clone()).collect();
    let mut got: Vec<Key> = listed.iter().map(|r| r.key.clone()).collect();
    let cursors: Vec<Cursor> = listed.iter().map(Cursor::of).collect();
    assert!(
        cursors.windows(2).all(|w| w[0] < w[1]),
        "in order, without repeats"
    );
    got.sort_by_key(|k| *k.digest());
    let mut want = expected.clone();
    want.sort_by_key(|k| *k.digest());
    assert_eq!(got, want, "every receipt once; no released, no expired one");
    let succeeded = store
        .list_receipts(
            &query.clone().limit(1_000).states([ReceiptState::Success]),
            time.now,
        )
        .await
        .expect("list");
    assert_eq!(succeeded.receipts.len(), 2);
    assert!(succeeded.next.is_none());
    // The widest range lists the same: bounds past what a store can hold mean "no bound".
    let everything = store
        .list_receipts(
            &ReceiptQuery::created_between(0, u64::MAX)
                .scope(scope.clone())
                .limit(1_000),
            time.now,
        )
        .await
        .expect("list the widest range");
    assert_eq!(everything.receipts.len(), expected.len());
    let other_scope = store
        .list_receipts(&query.clone().scope("samekey.nothing.here"), time.now)
        .await
        .expect("list");
    assert!(other_scope.receipts.is_empty());
}

/// A day listed in pages of many receipts: every receipt once, in order, whatever page size (a
/// backend that merges several indexes must merge them right).
pub async fn receipts_are_paged(store: Arc<dyn Store>) {
    let scope = format!("samekey.paging.{:x}", TraceId::new().as_u128());
    let time = Timeline::of(&*store, T0).await;
    let start = store.now_ms(time.now).await.expect("the store's time");
    let mut claims = tokio::task::JoinSet::new();
    for i in 0..400u32 {
        let (store, key) = (store.clone(), Key::build(&scope, &i));
        let now = time.now + u64::from(i % 7);
        claims.spawn(async move { acquire(&*store, &key, &call(), now).await });
    }
    while let Some(claimed) = claims.join_next().await {
        claimed.expect("claim");
    }
    let day = ReceiptQuery::created_between(start.saturating_sub(60_000), start + 3_600_000);
    let one_scope = day.clone().scope(scope.clone());
    for (query, limit) in [(one_scope.clone(), 40), (one_scope, 7), (day, 1_000)] {
        let mut query = query.limit(limit);
        let mut seen = Vec::new();
        loop {
            let page = store.list_receipts(&query, time.now).await.expect("list");
            seen.extend(
                page.receipts
                    .iter()
                    .filter(|r| r.key.scope() == scope)
                    .map(Cursor::of),
            );
            match page.next {
                Some(next) => query = query.after(next),
                None => break,
            }
        }
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            seen, sorted,
            "pages in order, each receipt once (limit {limit})"
        );
        assert_eq!(seen.len(), 400, "every receipt (limit {limit})");
    }
}

/// A record still `PROCESSING` after its owner's lease is an orphan (the owner crashed) until someone
/// resolves it; a live claim, an `UNKNOWN` one and a finished one are not.
pub async fn orphans_are_listed(store: Arc<dyn Store>) {
    let (crashed, alive, finished) = (fresh_key("orphan"), fresh_key("alive"), fresh_key("done"));
    let mut time = Timeline::of(&*store, T0).await;
    let mine = |records: Vec<crate::receipt::Receipt>| -> Vec<Key> {
        records
            .into_iter()
            .map(|r| r.key)
            .filter(|k| k == &crashed || k == &alive || k == &finished)
            .collect()
    };
    let claim_for = |key: &Key, now, lease| {
        let store = store.clone();
        let claim = claim(key, &call(), now, lease);
        async move {
            match store.claim(claim).await.expect("claim") {
                Claimed::Acquired(fence) => fence,
                Claimed::Existing(r) => panic!("fresh key held: {r:?}"),
            }
        }
    };
    // Leases long enough for a store that scans its whole keyspace to list (Redis).
    claim_for(&crashed, time.now, 1_000).await;
    let done = claim_for(&finished, time.now, 1_000).await;
    let early = store.list_orphans(time.now, 10_000).await.expect("list");
    assert!(
        mine(early.clone()).is_empty(),
        "leases still running: {early:?}"
    );
    store
        .complete(&finished, done, success(b"1", 60_000), time.now)
        .await
        .expect("complete");
    time.pass(1_100).await;
    claim_for(&alive, time.now, 60_000).await;
    let listed = store.list_orphans(time.now, 10_000).await.expect("list");
    let orphan = listed
        .iter()
        .find(|r| r.key == crashed)
        .expect("the crashed owner's record")
        .clone();
    assert_eq!(
        mine(listed),
        std::slice::from_ref(&crashed),
        "only the crashed owner's record"
    );
    store
        .enqueue_compensation(CompensationEntry::new(
            orphan.call_id.clone(),
            crashed.clone(),
            "orphan",
            time.now,
        ))
        .await
        .expect("enqueue");
    assert!(
        mine(store.list_orphans(time.now, 10_000).await.expect("list")).is_empty(),
        "a queued orphan is not listed again"
    );
    store
        .finish_compensation(&orphan.call_id, None)
        .await
        .expect("finish");
}
