//! The compensation queue contract: an entry is queued once per callId, taken by one worker at a time
//! under a lease and a worker fence, rescheduled, escalated to `MANUAL` or finished; a worker whose
//! lease lapsed and whose entry was taken again is refused.

use std::sync::Arc;

use super::support::{call, fresh_key, Timeline, T0};
use crate::call_id::CallId;
use crate::compensation::{CompensationEntry, CompensationState};
use crate::error::StoreError;
use crate::receipt::Fence;
use crate::store::Store;

/// The compensation queue: once per callId, leased to one taker under a worker fence, rescheduled,
/// escalated, finished; a worker whose lease lapsed and whose entry was taken again is refused.
pub async fn compensation_queue(store: Arc<dyn Store>) {
    let key = fresh_key("comp");
    let (a, b) = (call(), call());
    let mut time = Timeline::of(&*store, T0).await;
    let entry = |id: &CallId, now| CompensationEntry::new(id.clone(), key.clone(), "test", now);
    store
        .enqueue_compensation(entry(&a, time.now))
        .await
        .expect("enqueue");
    store
        .enqueue_compensation(entry(&a, time.now + 1))
        .await
        .expect("enqueue twice");
    // `b` carries what a worker needs to act, and keeps it through every move below.
    let mut carrying = entry(&b, time.now + 2);
    carrying.attempts = 3;
    carrying.last_error = Some(crate::journal::AttemptOutcome::TimedOut);
    carrying.encoded_inputs = Some(Arc::from(&br#"["o-1",700]"#[..]));
    store
        .enqueue_compensation(carrying.clone())
        .await
        .expect("enqueue");
    let carries = |e: &CompensationEntry| {
        e.attempts == carrying.attempts
            && e.last_error == carrying.last_error
            && e.encoded_inputs == carrying.encoded_inputs
    };
    let mine = |entries: Vec<CompensationEntry>| -> Vec<CompensationEntry> {
        entries
            .into_iter()
            .filter(|e| e.call_id == a || e.call_id == b)
            .collect()
    };
    let listed = mine(store.list_compensations().await.expect("list"));
    assert_eq!(
        listed.iter().map(|e| &e.call_id).collect::<Vec<_>>(),
        [&a, &b],
        "one entry per callId, oldest first"
    );
    assert!(listed.iter().all(|e| e.fence == Fence(0)), "never taken");
    assert!(
        carries(&listed[1]),
        "an entry keeps its attempts, last error and inputs: {listed:?}"
    );
    assert_eq!((listed[0].attempts, listed[0].last_error), (0, None));
    assert_eq!(listed[0].encoded_inputs, None);
    time.pass(10).await;
    let taken = mine(
        store
            .take_due_compensations(time.now, 100, 300)
            .await
            .expect("take"),
    );
    assert_eq!(taken.len(), 2);
    assert!(taken.iter().any(carries), "taken entries keep them too");
    assert!(taken
        .iter()
        .all(|e| matches!(e.state, CompensationState::Taken { .. }) && e.fence > Fence(0)));
    let first = taken
        .iter()
        .find(|e| e.call_id == a)
        .expect("a taken")
        .fence;
    let b_fence = taken
        .iter()
        .find(|e| e.call_id == b)
        .expect("b taken")
        .fence;
    let again = mine(
        store
            .take_due_compensations(time.now + 1, 100, 300)
            .await
            .expect("take"),
    );
    assert!(again.is_empty(), "leased entries stay with their taker");

    // The lease lapses; another worker takes `a` under a larger fence, and the first is refused.
    time.pass(400).await;
    let retaken = mine(
        store
            .take_due_compensations(time.now, 100, 60_000)
            .await
            .expect("take"),
    );
    let second = retaken
        .iter()
        .find(|e| e.call_id == a)
        .expect("a is due again once its lease lapsed")
        .fence;
    assert!(second > first, "a new take, a larger fence");
    let b_fence = retaken
        .iter()
        .find(|e| e.call_id == b)
        .map_or(b_fence, |e| e.fence);
    assert!(matches!(
        store
            .reschedule_compensation(&a, first, 1, 5_000, time.now)
            .await,
        Err(StoreError::Fenced { .. })
    ));
    assert!(matches!(
        store.escalate_compensation(&a, first, time.now).await,
        Err(StoreError::Fenced { .. })
    ));
    assert!(matches!(
        store.finish_compensation(&a, Some(first)).await,
        Err(StoreError::Fenced { .. })
    ));
    store
        .reschedule_compensation(&a, second, 1, 5_000, time.now)
        .await
        .expect("the holder reschedules");
    store
        .escalate_compensation(&b, b_fence, time.now)
        .await
        .expect("the holder escalates");
    time.pass(1_000).await;
    let later = mine(
        store
            .take_due_compensations(time.now, 100, 60_000)
            .await
            .expect("take"),
    );
    assert!(later.is_empty(), "not due yet, or manual");
    let all = mine(store.list_compensations().await.expect("list"));
    let a_entry = all.iter().find(|e| e.call_id == a).expect("a stays");
    assert_eq!(
        (a_entry.round, a_entry.state),
        (1, CompensationState::Pending)
    );
    let b_entry = all.iter().find(|e| e.call_id == b).expect("b stays");
    assert_eq!(b_entry.state, CompensationState::Manual);
    store
        .finish_compensation(&a, Some(second))
        .await
        .expect("the holder finishes");
    store
        .finish_compensation(&a, Some(second))
        .await
        .expect("finish twice");
    store
        .finish_compensation(&b, None)
        .await
        .expect("a person finishes a manual entry");
    assert!(mine(store.list_compensations().await.expect("list")).is_empty());
    assert!(matches!(
        store
            .reschedule_compensation(&a, second, 2, 0, time.now)
            .await,
        Err(StoreError::NotFound)
    ));
    compensation_take_is_exclusive(store).await;
}

/// Of many workers taking due entries at once, each entry goes to exactly one. (Part of
/// [`compensation_queue`]: a store's queue is shared, and two checks taking from it at once would take
/// each other's entries.)
async fn compensation_take_is_exclusive(store: Arc<dyn Store>) {
    let key = fresh_key("comp-race");
    let time = Timeline::of(&*store, T0).await;
    let ids: Vec<CallId> = (0..20).map(|_| call()).collect();
    for id in &ids {
        store
            .enqueue_compensation(CompensationEntry::new(
                id.clone(),
                key.clone(),
                "race",
                time.now,
            ))
            .await
            .expect("enqueue");
    }
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let store = store.clone();
        let now = time.now + 10;
        set.spawn(async move { store.take_due_compensations(now, 5, 60_000).await });
    }
    let mut taken = Vec::new();
    while let Some(joined) = set.join_next().await {
        taken.extend(
            joined
                .expect("task")
                .expect("take")
                .into_iter()
                .filter(|e| ids.contains(&e.call_id))
                .map(|e| e.call_id),
        );
    }
    let mut unique = taken.clone();
    unique.sort_by_key(CallId::to_string);
    unique.dedup();
    assert_eq!(unique.len(), taken.len(), "an entry went to two workers");
    for id in &ids {
        store.finish_compensation(id, None).await.expect("finish");
    }
}
