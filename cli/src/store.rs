//! Opening a store from its URL, with errors an operator can act on.

use std::sync::Arc;

use samekey_runtime::Store;

use crate::Failure;

/// Opens the store `url` names. An SQLite file must exist (a typo must not create an empty store).
pub async fn open(url: &str, redis_prefix: &str) -> Result<Arc<dyn Store>, Failure> {
    let unreachable =
        |e: &dyn std::fmt::Display| Failure::store(format!("cannot open the store {url}: {e}"));
    if let Some(path) = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    {
        #[cfg(feature = "sqlite")]
        {
            if !std::path::Path::new(path).exists() {
                return Err(Failure::store(format!("no SQLite store at {path}")));
            }
            let store = samekey_runtime::store::SqliteStore::open(path)
                .await
                .map_err(|e| unreachable(&e))?;
            return Ok(Arc::new(store));
        }
        #[cfg(not(feature = "sqlite"))]
        return Err(Failure::usage(format!(
            "{path}: this build has no SQLite (feature `sqlite`)"
        )));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        {
            let store = samekey_runtime::store::PgStore::connect(url)
                .await
                .map_err(|e| unreachable(&e))?;
            return Ok(Arc::new(store));
        }
        #[cfg(not(feature = "postgres"))]
        return Err(Failure::usage(
            "this build has no PostgreSQL (feature `postgres`)",
        ));
    }
    if url.starts_with("redis://") || url.starts_with("rediss://") {
        #[cfg(feature = "redis")]
        {
            let nodes: Vec<&str> = url.split(',').map(str::trim).collect();
            let store = if nodes.len() > 1 {
                samekey_runtime::store::RedisStore::connect_cluster_unverified(&nodes, redis_prefix)
                    .await
            } else {
                samekey_runtime::store::RedisStore::connect_unverified(url, redis_prefix).await
            };
            return Ok(Arc::new(store.map_err(|e| unreachable(&e))?));
        }
        #[cfg(not(feature = "redis"))]
        return Err(Failure::usage("this build has no Redis (feature `redis`)"));
    }
    let _ = redis_prefix;
    Err(Failure::usage(format!(
        "{url:?} is not a store URL: sqlite:PATH, postgres://USER@HOST/DB, redis://HOST:PORT"
    )))
}
