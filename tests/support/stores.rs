//! The stores the scenario suites run on (see `on_stores!`): each `None` when its server is not
//! configured, after saying so past the output capture.

use std::sync::Arc;

use samekey::Store;

pub async fn memory() -> Option<Arc<dyn Store>> {
    Some(Arc::new(samekey::MemoryStore::new()))
}

/// A `LocalCache` in front of the in-memory store: finished receipts answered in process.
pub async fn local_cache() -> Option<Arc<dyn Store>> {
    Some(Arc::new(samekey::store::LocalCache::new(
        samekey::MemoryStore::new(),
        1_000,
    )))
}

#[cfg(feature = "sqlite")]
pub async fn sqlite() -> Option<Arc<dyn Store>> {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("scenario-{:x}", samekey::TraceId::new().as_u128()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let store = samekey::store::SqliteStore::open(dir.join("s.db"))
        .await
        .expect("open SQLite");
    Some(Arc::new(store))
}

#[cfg(feature = "postgres")]
pub async fn postgres() -> Option<Arc<dyn Store>> {
    let Ok(url) = std::env::var("SAMEKEY_PG_URL") else {
        samekey::conformance::skipped(
            "set SAMEKEY_PG_URL (scripts/services start) to run the scenarios on PostgreSQL",
        );
        return None;
    };
    let store = samekey::store::PgStore::connect(&url)
        .await
        .expect("connect to SAMEKEY_PG_URL");
    Some(Arc::new(store))
}

#[cfg(feature = "mysql")]
pub async fn mysql() -> Option<Arc<dyn Store>> {
    Some(Arc::new(mysql_store(None).await?))
}

/// The MySQL store in `SAMEKEY_MYSQL_URL`'s database, or in `database` beside it (created if
/// missing): the scenarios of two stores that run at once must not share one compensation queue.
#[cfg(feature = "mysql")]
async fn mysql_store(database: Option<&str>) -> Option<samekey::store::MySqlStore> {
    let Ok(url) = std::env::var("SAMEKEY_MYSQL_URL") else {
        samekey::conformance::skipped(
            "set SAMEKEY_MYSQL_URL (scripts/services start) to run the scenarios on MySQL",
        );
        return None;
    };
    let url = match database {
        None => url,
        Some(database) => {
            let store = samekey::store::MySqlStore::connect(&url)
                .await
                .expect("connect to SAMEKEY_MYSQL_URL");
            let create = format!("CREATE DATABASE IF NOT EXISTS {database}");
            samekey::sqlx::raw_sql(samekey::sqlx::AssertSqlSafe(create))
                .execute(store.pool())
                .await
                .expect("create the database");
            let (path, query) = url.split_once('?').unwrap_or((&url, ""));
            let (server, _) = path.rsplit_once('/').expect("a database in the URL");
            format!(
                "{server}/{database}{}{query}",
                if query.is_empty() { "" } else { "?" }
            )
        }
    };
    let store = samekey::store::MySqlStore::connect(&url)
        .await
        .expect("connect to SAMEKEY_MYSQL_URL");
    Some(store)
}

/// A `CachedStore` over MySQL (a database of its own, `samekey_cached`): finished receipts answered
/// from Redis (on a key prefix of its own).
#[cfg(all(feature = "mysql", feature = "redis"))]
pub async fn mysql_cached() -> Option<Arc<dyn Store>> {
    let durable = mysql_store(Some("samekey_cached")).await?;
    let Ok(url) = std::env::var("SAMEKEY_REDIS_URL") else {
        samekey::conformance::skipped(
            "set SAMEKEY_REDIS_URL (scripts/services start) to run the scenarios on MySQL behind Redis",
        );
        return None;
    };
    let prefix = format!("scenario-{:x}", samekey::TraceId::new().as_u128());
    let cache = samekey::store::RedisStore::connect_with_prefix(&url, &prefix)
        .await
        .expect("connect to SAMEKEY_REDIS_URL");
    Some(Arc::new(samekey::store::CachedStore::new(durable, cache)))
}

/// A Redis store on a key prefix of its own.
#[cfg(feature = "redis")]
pub async fn redis() -> Option<Arc<dyn Store>> {
    let Ok(url) = std::env::var("SAMEKEY_REDIS_URL") else {
        samekey::conformance::skipped(
            "set SAMEKEY_REDIS_URL (scripts/services start) to run the scenarios on Redis",
        );
        return None;
    };
    let prefix = format!("scenario-{:x}", samekey::TraceId::new().as_u128());
    let store = samekey::store::RedisStore::connect_with_prefix(&url, &prefix)
        .await
        .expect("connect to SAMEKEY_REDIS_URL");
    Some(Arc::new(store))
}
