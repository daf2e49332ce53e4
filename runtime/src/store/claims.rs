//! [`ClaimTracker`]: what the claims taken through a store know of their receipts, kept until they
//! finish. Its guarantees are stated on the type.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use super::{async_trait, Claim, Claimed, Completion, Store, StoreWrapper};
use crate::call_id::CallId;
use crate::error::StoreError;
use crate::key::{Fingerprint, Key};
use crate::receipt::{Fence, Receipt, Transition};

/// A store that remembers, for each claim taken through it and not finished yet, what the finished
/// receipt will hold beyond its completion, so that [`complete_tracked`](Self::complete_tracked)
/// hands that receipt back: the part of a cache of finished receipts that does not depend on where
/// the receipts are kept ([`LocalCache`](super::LocalCache) and `CachedStore` are written over it).
///
/// # Guarantees
///
/// * **Only what the store committed.** [`ClaimTracker::complete_tracked`] gives back a receipt only
///   when the completion applied ([`Transition::Applied`]) under the fence of a claim taken through
///   the tracker: the receipt the wrapped store then holds (the claim's callId, fingerprint and
///   creation time; the completion's state and outcome; an expiry `ttl` after the completion's
///   `now_ms`). A repeated completion, a refused one, and one of a key claimed elsewhere give none.
/// * **One owner's knowledge, not another's.** A claim's knowledge goes when its owner gives the key
///   up or loses it: a completion, `UNKNOWN`, a release, a forget, a lease extension refused because
///   the key is no longer its, a take-over through the tracker. A later claim of the key (another
///   fence) keeps its own.
/// * **Bounded when asked.** Past its [`limit`](ClaimTracker::limit), a new claim is not tracked (its
///   completion gives back no receipt); a key tracked already is tracked anew.
pub struct ClaimTracker<S> {
    store: S,
    open: Mutex<HashMap<[u8; 32], Open>>,
    limit: usize,
}

/// What a claim taken through a [`ClaimTracker`] knows of its receipt.
struct Open {
    fence: Fence,
    call_id: CallId,
    fingerprint: Option<Fingerprint>,
    created_ms: u64,
}

impl<S: Store> ClaimTracker<S> {
    /// `store`, tracking every claim taken through it.
    pub fn new(store: S) -> ClaimTracker<S> {
        ClaimTracker {
            store,
            open: Mutex::default(),
            limit: usize::MAX,
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.store
    }

    /// Tracks at most `limit` claims at a time.
    pub fn limit(mut self, limit: usize) -> ClaimTracker<S> {
        self.limit = limit;
        self
    }

    /// [`Store::complete`], and the receipt the store holds once the completion applied to a claim
    /// taken through this tracker under `fence` (see the type's documentation).
    pub async fn complete_tracked(
        &self,
        key: &Key,
        fence: Fence,
        completion: Completion,
        now_ms: u64,
    ) -> Result<(Transition, Option<Receipt>), StoreError> {
        let open = self.disown(key, fence);
        let (state, outcome, ttl_ms) = (
            completion.state,
            completion.outcome.clone(),
            completion.ttl_ms,
        );
        let transition = self.store.complete(key, fence, completion, now_ms).await?;
        let finished = match (transition, open) {
            (Transition::Applied, Some(open)) => Some(Receipt {
                key: key.clone(),
                call_id: open.call_id,
                state,
                fence,
                lease_until_ms: None,
                expires_at_ms: Some(now_ms.saturating_add(ttl_ms)),
                fingerprint: open.fingerprint,
                outcome,
                created_ms: open.created_ms,
                updated_ms: now_ms,
            }),
            _ => None,
        };
        Ok((transition, finished))
    }

    /// How many claims are tracked now.
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.open().len()
    }

    fn open(&self) -> MutexGuard<'_, HashMap<[u8; 32], Open>> {
        // Every update is a plain insert or remove: a poisoned map is still consistent.
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Forgets what a claim of `key` taken under `fence` knew, and returns it. What a later claim
    /// (another fence) knew stays.
    fn disown(&self, key: &Key, fence: Fence) -> Option<Open> {
        let mut open = self.open();
        match open.get(key.digest()) {
            Some(o) if o.fence == fence => open.remove(key.digest()),
            _ => None,
        }
    }
}

#[async_trait]
impl<S: Store> StoreWrapper for ClaimTracker<S> {
    type Inner = S;

    fn wrapped(&self) -> &S {
        &self.store
    }

    async fn claim(this: &Self, claim: Claim) -> Result<Claimed, StoreError> {
        let (digest, created_ms) = (*claim.key.digest(), claim.now_ms);
        let (call_id, fingerprint) = (claim.call_id.clone(), claim.fingerprint);
        let claimed = this.store.claim(claim).await?;
        if let Claimed::Acquired(fence) = claimed {
            let mut open = this.open();
            // Past the limit, a completion gives back no receipt. An earlier owner's entry for the
            // key is replaced.
            if open.contains_key(&digest) || open.len() < this.limit {
                let claim = Open {
                    fence,
                    call_id,
                    fingerprint,
                    created_ms,
                };
                open.insert(digest, claim);
            }
        }
        Ok(claimed)
    }

    async fn take_over(
        this: &Self,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Claimed, StoreError> {
        let taken = this
            .store
            .take_over(key, expected, lease_ms, now_ms)
            .await?;
        if let Claimed::Acquired(_) = taken {
            // What an earlier owner of the key knew is superseded.
            this.open().remove(key.digest());
        }
        Ok(taken)
    }

    async fn extend_lease(
        this: &Self,
        key: &Key,
        fence: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let extended = this.store.extend_lease(key, fence, lease_ms, now_ms).await;
        if extended.as_ref().is_err_and(StoreError::lost_key) {
            // The key is no longer this owner's.
            this.disown(key, fence);
        }
        extended
    }

    async fn complete(
        this: &Self,
        key: &Key,
        fence: Fence,
        completion: Completion,
        now_ms: u64,
    ) -> Result<Transition, StoreError> {
        let (transition, _) = this
            .complete_tracked(key, fence, completion, now_ms)
            .await?;
        Ok(transition)
    }

    async fn mark_unknown(
        this: &Self,
        key: &Key,
        fence: Fence,
        now_ms: u64,
    ) -> Result<Transition, StoreError> {
        this.disown(key, fence);
        this.store.mark_unknown(key, fence, now_ms).await
    }

    async fn release(this: &Self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        this.disown(key, fence);
        this.store.release(key, fence).await
    }

    async fn forget(this: &Self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        this.disown(key, fence);
        this.store.forget(key, fence).await
    }
}

impl<S> std::fmt::Debug for ClaimTracker<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimTracker").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::receipt::ReceiptState;
    use crate::store::MemoryStore;

    fn claim(key: &Key, now_ms: u64) -> Claim {
        Claim {
            key: key.clone(),
            call_id: CallId::new("trk", "test").unwrap(),
            fingerprint: None,
            lease_ms: 10_000,
            now_ms,
        }
    }

    fn success(ttl_ms: u64) -> Completion {
        Completion {
            state: ReceiptState::Success,
            outcome: Some(b"42".as_slice().into()),
            ttl_ms,
        }
    }

    async fn acquired(store: &impl Store, key: &Key, now_ms: u64) -> Fence {
        match store.claim(claim(key, now_ms)).await {
            Ok(Claimed::Acquired(fence)) => fence,
            other => panic!("a fresh key: {other:?}"),
        }
    }

    /// The receipt handed back is the one the store now holds.
    #[tokio::test]
    async fn a_completion_hands_back_the_receipt_the_store_holds() {
        let tracker = ClaimTracker::new(MemoryStore::new());
        let key = Key::build("tracker", &1u64);
        let fence = acquired(&tracker, &key, 1_000).await;
        assert_eq!(tracker.tracked(), 1);
        let (transition, finished) = tracker
            .complete_tracked(&key, fence, success(60_000), 2_000)
            .await
            .unwrap();
        assert_eq!(transition, Transition::Applied);
        let stored = tracker.inner().get(&key, 2_000).await.unwrap();
        assert_eq!(finished, stored);
        assert_eq!(tracker.tracked(), 0);
    }

    /// A claim taken past the tracker, a repeated completion and a stale owner's give nothing back.
    #[tokio::test]
    async fn only_a_tracked_claim_s_first_completion_hands_back_a_receipt() {
        let tracker = ClaimTracker::new(MemoryStore::new());
        let (a, b) = (Key::build("tracker", &2u64), Key::build("tracker", &3u64));
        let untracked = acquired(tracker.inner(), &a, 1_000).await;
        let done = tracker.complete_tracked(&a, untracked, success(60_000), 1_000);
        assert!(matches!(done.await, Ok((Transition::Applied, None))));
        let again = tracker.complete_tracked(&a, untracked, success(60_000), 1_000);
        assert!(matches!(
            again.await,
            Ok((Transition::AlreadyApplied, None))
        ));
        // The owner of `b` stalls past its lease; another node takes the key over.
        let stale = acquired(&tracker, &b, 1_000).await;
        let taken = tracker.inner().take_over(&b, stale, 10_000, 20_000).await;
        assert!(matches!(taken, Ok(Claimed::Acquired(_))));
        let late = tracker.complete_tracked(&b, stale, success(60_000), 21_000);
        assert!(matches!(late.await, Err(StoreError::Fenced { .. })));
        assert_eq!(tracker.tracked(), 0, "the stale owner's knowledge went");
    }

    /// Past its limit, a new claim is not tracked.
    #[tokio::test]
    async fn the_limit_bounds_what_is_tracked() {
        let tracker = ClaimTracker::new(MemoryStore::new()).limit(1);
        let (a, b) = (Key::build("tracker", &4u64), Key::build("tracker", &5u64));
        acquired(&tracker, &a, 1_000).await;
        let fence = acquired(&tracker, &b, 1_000).await;
        assert_eq!(tracker.tracked(), 1);
        let done = tracker.complete_tracked(&b, fence, success(60_000), 1_000);
        assert!(matches!(done.await, Ok((Transition::Applied, None))));
    }
}
