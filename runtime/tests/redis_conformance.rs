//! The store conformance suite on Redis: the standalone store, and the front cache over the in-memory
//! and the PostgreSQL store. Needs `SAMEKEY_REDIS_URL` (and `SAMEKEY_PG_URL` for the cache over
//! PostgreSQL; see `scripts/services`); without them every test prints that it was skipped.
#![cfg(feature = "redis")]

use std::sync::Arc;

use samekey_runtime::store::{CachedStore, RedisStore};
use samekey_runtime::MemoryStore;

fn redis_url() -> Option<String> {
    let url = std::env::var("SAMEKEY_REDIS_URL").ok();
    if url.is_none() {
        samekey_runtime::conformance::skipped(
            "set SAMEKEY_REDIS_URL (scripts/services start) to run the Redis suite",
        );
    }
    url
}

/// Each test on a key prefix of its own, so that tests never see each other's queue.
fn prefix() -> String {
    format!(
        "samekey-test-{:x}",
        samekey_runtime::TraceId::new().as_u128()
    )
}

mod standalone {
    use super::*;

    async fn store() -> Option<Arc<RedisStore>> {
        let url = redis_url()?;
        Some(Arc::new(
            RedisStore::connect_with_prefix(&url, &prefix())
                .await
                .expect("connect to SAMEKEY_REDIS_URL"),
        ))
    }

    samekey_runtime::store_conformance_tests!(optional: store().await);

    /// Another process (another connection, with nothing of the claimer's in memory) finds a call in
    /// flight by its callId, receipt and journal, shortly after its claim and before its next write.
    #[tokio::test]
    async fn a_call_in_flight_is_found_by_callid_from_another_process() {
        use samekey_runtime::store::{Claim, Claimed};
        use samekey_runtime::{journal::Event, journal::EventKind, CallId, Key, Store};
        let Some(url) = redis_url() else { return };
        let prefix = prefix();
        let claimer = RedisStore::connect_with_prefix(&url, &prefix)
            .await
            .expect("connect");
        let other = RedisStore::connect_with_prefix(&url, &prefix)
            .await
            .expect("connect");
        let key = Key::build("samekey.test", &("in-flight", 1u8));
        let call_id = CallId::new("t", "n1").expect("callId");
        let claim = Claim {
            key: key.clone(),
            call_id: call_id.clone(),
            fingerprint: None,
            lease_ms: 60_000,
            now_ms: 0,
        };
        let Ok(Claimed::Acquired(fence)) = claimer.claim(claim).await else {
            panic!("a fresh key is acquired");
        };
        let event = Event {
            call_id: call_id.clone(),
            at_ms: 1,
            node: "n1".into(),
            what: EventKind::Claimed { fence: fence.0 },
        };
        claimer
            .append_journal(&key, std::slice::from_ref(&event), 60_000, 0)
            .await
            .expect("append");
        let mut found = None;
        for _ in 0..100 {
            found = other.get_by_call_id(&call_id).await.expect("get");
            if found.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let found = found.expect("the call is found by callId from another process");
        assert_eq!(found.fence, fence);
        assert_eq!(
            other.journal_of_call(&call_id, 0).await.expect("journal"),
            vec![event]
        );
    }
}

/// The standalone store on a three-primary Redis Cluster (`SAMEKEY_REDIS_CLUSTER_URLS`, comma-separated).
mod cluster {
    use super::*;

    /// The cluster's node URLs, from `SAMEKEY_REDIS_CLUSTER_URLS` (comma-separated).
    fn nodes() -> Option<Vec<String>> {
        let Ok(urls) = std::env::var("SAMEKEY_REDIS_CLUSTER_URLS") else {
            samekey_runtime::conformance::skipped("set SAMEKEY_REDIS_CLUSTER_URLS (scripts/services start) to run the Redis Cluster suite");
            return None;
        };
        Some(
            urls.split(',')
                .filter(|u| !u.is_empty())
                .map(str::to_owned)
                .collect(),
        )
    }

    async fn connect(nodes: &[String], prefix: &str) -> RedisStore {
        let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
        RedisStore::connect_cluster_with_prefix(&nodes, prefix)
            .await
            .expect("connect to SAMEKEY_REDIS_CLUSTER_URLS")
    }

    async fn store() -> Option<Arc<RedisStore>> {
        Some(Arc::new(connect(&nodes()?, &prefix()).await))
    }

    samekey_runtime::store_conformance_tests!(optional: store().await);

    /// The keys of one store really are spread over the cluster's nodes (the suite would also pass if
    /// everything landed on one).
    #[tokio::test]
    async fn keys_spread_over_the_nodes() {
        let Some(nodes) = nodes() else { return };
        let prefix = prefix();
        let store = connect(&nodes, &prefix).await;
        use samekey_runtime::Store;
        for n in 0..64u64 {
            let claim = samekey_runtime::store::Claim {
                key: samekey_runtime::Key::build("spread", &n),
                call_id: samekey_runtime::CallId::new("t", "t").unwrap(),
                fingerprint: None,
                lease_ms: 9,
                now_ms: 1,
            };
            store.claim(claim).await.expect("claim");
        }
        // Ask each node what it holds (with redis-cli, which comes with the server).
        let mut holding = 0;
        for url in &nodes {
            let port = url
                .trim_end_matches('/')
                .rsplit(':')
                .next()
                .expect("a port");
            let out = std::process::Command::new("redis-cli")
                .args(["-p", port, "--scan", "--pattern", &format!("{prefix}:r:*")])
                .output()
                .expect("redis-cli");
            holding += usize::from(!out.stdout.is_empty());
        }
        assert!(holding >= 2, "64 keys landed on {holding} node(s)");
    }
}

mod cache_over_memory {
    use super::*;

    async fn store() -> Option<Arc<CachedStore<MemoryStore>>> {
        let url = redis_url()?;
        let cache = RedisStore::connect_unverified(&url, &prefix())
            .await
            .expect("connect to SAMEKEY_REDIS_URL");
        Some(Arc::new(CachedStore::new(MemoryStore::new(), cache)))
    }

    samekey_runtime::store_conformance_tests!(optional: store().await);
}

#[cfg(feature = "postgres")]
mod cache_over_postgres {
    use super::*;
    use samekey_runtime::store::PgStore;

    async fn store() -> Option<Arc<CachedStore<PgStore>>> {
        let url = redis_url()?;
        let Ok(pg) = std::env::var("SAMEKEY_PG_URL") else {
            samekey_runtime::conformance::skipped(
                "set SAMEKEY_PG_URL to run the cache over PostgreSQL",
            );
            return None;
        };
        let cache = RedisStore::connect_unverified(&url, &prefix())
            .await
            .expect("connect to SAMEKEY_REDIS_URL");
        let durable = PgStore::connect(&pg)
            .await
            .expect("connect to SAMEKEY_PG_URL");
        Some(Arc::new(CachedStore::new(durable, cache)))
    }

    samekey_runtime::store_conformance_tests!(optional: store().await);
}
