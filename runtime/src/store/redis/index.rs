//! The index entries a claim writes beside its record, on keys of other slots: the callId index (a
//! callId to its key's digest, `samekey:c:{<callId>}`) and the creation-time index (the key's digest in
//! one of the sorted sets `samekey:{created-<0..f>}`, scored by its creation time). They go out in the
//! background while the call goes on; until they are known written, this process keeps them, finds
//! the call by them, and sends them again with the key's next write (see
//! [The callId index](RedisStore#the-callid-index)).

use redis::AsyncCommands;

use super::{corrupt, unavailable, RedisStore};
use crate::call_id::CallId;
use crate::error::StoreError;
use crate::key::{hex, Key};

/// A claim whose index entries (its callId's, its creation time's) are not known written yet.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Unindexed {
    pub(super) call_id: CallId,
    pub(super) created_ms: u64,
}

impl RedisStore {
    /// Writes the callId index entry of a claim that took `key`, in the background: the call goes on
    /// at once, and another process finds the call by its callId a round trip later. Until the entry
    /// is known written, it also waits in [`RedisStore::index_later`]: this process finds the call
    /// meanwhile, and should the background write fail, the key's next write sends it again.
    pub(super) fn index_soon(&self, key: &Key, entry: Unindexed) {
        self.index_later(key, entry.clone());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.clone();
        let digest = *key.digest();
        runtime.spawn(async move {
            if store.send_index(&digest, &entry).await.is_ok() {
                store.indexed(&digest, &entry);
            }
        });
    }

    /// Forgets a claim's entries once they are known written (unless another claim of the key
    /// replaced them meanwhile).
    pub(super) fn indexed(&self, digest: &[u8; 32], entry: &Unindexed) {
        let mut waiting = self.unindexed.lock().unwrap_or_else(|p| p.into_inner());
        if waiting.get(digest) == Some(entry) {
            waiting.remove(digest);
        }
    }

    pub(super) fn index_later(&self, key: &Key, entry: Unindexed) {
        self.unindexed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(*key.digest(), entry);
    }

    /// Writes a claim's index entries: its callId's (to its key) and its creation time's (the key in
    /// the time-ordered set of its shard), side by side.
    pub(super) async fn send_index(
        &self,
        digest: &[u8; 32],
        entry: &Unindexed,
    ) -> redis::RedisResult<()> {
        let by_call = redis::cmd("SET")
            .arg(self.index_key(&entry.call_id))
            .arg(digest.as_slice())
            .arg("PX")
            .arg(u64::try_from(self.index_ttl.as_millis()).unwrap_or(u64::MAX))
            .clone();
        let by_time = redis::cmd("ZADD")
            .arg(self.time_key(digest[0] >> 4))
            .arg(entry.created_ms)
            .arg(hex(digest))
            .clone();
        let (mut a, mut b) = (self.conn(), self.conn());
        let (called, timed) = tokio::join!(
            by_call.query_async::<()>(&mut a),
            by_time.query_async::<()>(&mut b)
        );
        called.and(timed)
    }

    /// The key `call_id` claimed (its digest, without scope), from the callId index, or from this
    /// process's claims whose index entry is not known written yet.
    pub(super) async fn key_of_call(&self, call_id: &CallId) -> Result<Option<Key>, StoreError> {
        let digest: Option<Vec<u8>> = self
            .conn()
            .get(self.index_key(call_id))
            .await
            .map_err(unavailable)?;
        let digest = match digest {
            Some(digest) => digest,
            None => match self
                .unindexed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .find(|(_, owner)| owner.call_id == *call_id)
            {
                Some((digest, _)) => digest.to_vec(),
                None => return Ok(None),
            },
        };
        let digest: [u8; 32] = digest
            .as_slice()
            .try_into()
            .map_err(|_| corrupt("a key is 32 bytes"))?;
        Ok(Some(Key::from_digest("", digest)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Claim, Claimed, Store};

    /// A claim whose background index write failed waits for the key's next write; a write dropped
    /// mid-way (a lease's renewal, dropped as the work it kept alive ends) leaves it waiting, for the
    /// write after — it is never lost, or the call could not be found by its callId (a callback, a
    /// receipt lookup). Needs `SAMEKEY_REDIS_URL`.
    #[tokio::test]
    async fn a_write_dropped_mid_way_leaves_the_index_entry_waiting() {
        let Ok(url) = std::env::var("SAMEKEY_REDIS_URL") else {
            crate::conformance::skipped("set SAMEKEY_REDIS_URL to run the Redis index test");
            return;
        };
        let store = RedisStore::connect(&url).await.expect("connect");
        let key = Key::build(
            "samekey.redis.index",
            &crate::TraceId::new().as_u128().to_string().as_str(),
        );
        let call_id = CallId::new("idx", "test").expect("valid labels");
        let now = 1_800_000_000_000;
        let claimed = store
            .claim(Claim {
                key: key.clone(),
                call_id: call_id.clone(),
                fingerprint: None,
                lease_ms: 60_000,
                now_ms: now,
            })
            .await
            .expect("claim");
        let Claimed::Acquired(fence) = claimed else {
            panic!("a fresh key is acquired: {claimed:?}");
        };
        // As if its background write had failed: the entry waits for the key's next write.
        let entry = Unindexed {
            call_id: call_id.clone(),
            created_ms: now,
        };
        store.index_later(&key, entry.clone());
        // The renewal is polled exactly once (it sends), then dropped before its answer. (A zero
        // `timeout` was used here, and it let the renewal finish: a zero sleep waits for the timer's
        // next millisecond, long enough for a loopback round trip on a loaded machine.)
        let once = {
            let mut renewal = store.extend_lease(&key, fence, 60_000, now);
            std::future::poll_fn(|cx| std::task::Poll::Ready(renewal.as_mut().poll(cx))).await
        };
        let waiting = store
            .unindexed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key.digest())
            .cloned();
        assert!(once.is_pending(), "one poll cannot hear Redis: {once:?}");
        assert_eq!(waiting, Some(entry), "the entry still waits");
        // The next write sends it, and the call is found by its callId.
        store
            .extend_lease(&key, fence, 60_000, now)
            .await
            .expect("renewal");
        assert_eq!(
            store.key_of_call(&call_id).await.expect("lookup"),
            Some(key)
        );
    }
}
