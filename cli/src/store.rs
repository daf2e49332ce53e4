//! Opening a store from its URL, with errors an operator can act on.

use std::sync::Arc;

use samekey_runtime::Store;

use crate::Failure;

/// The command never creates a store: a URL that names a database without samekey's tables (a typo,
/// another database) is an error, not a new empty store.
fn never_migrated(url: &str) -> Failure {
    Failure::store(format!(
        "{url} holds no samekey tables: it was never used as a samekey store (or names another database); the command never creates them"
    ))
}

/// Opens the store `url` names. An SQLite file, a PostgreSQL or a MySQL database must hold samekey's tables (a
/// typo must not create an empty store); an older schema is brought up to date, as a service of this
/// version does when it starts.
pub async fn open(url: &str, redis_prefix: &str) -> Result<Arc<dyn Store>, Failure> {
    let unreachable =
        |e: &dyn std::fmt::Display| Failure::store(format!("cannot open the store {url}: {e}"));
    if let Some(path) = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    {
        #[cfg(feature = "sqlite")]
        {
            use samekey_runtime::sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
            if !std::path::Path::new(path).exists() {
                return Err(Failure::store(format!("no SQLite store at {path}")));
            }
            let options = SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(false)
                .busy_timeout(std::time::Duration::from_secs(5));
            let pool = SqlitePoolOptions::new()
                .max_connections(2)
                .connect_with(options)
                .await
                .map_err(|e| unreachable(&e))?;
            let tables: i64 = samekey_runtime::sqlx::query_scalar(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'samekey_receipts'",
            )
            .fetch_one(&pool)
            .await
            .map_err(|e| unreachable(&e))?;
            if tables == 0 {
                return Err(never_migrated(url));
            }
            let store = samekey_runtime::store::SqliteStore::from_pool(pool);
            store.migrate().await.map_err(|e| unreachable(&e))?;
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
            let pool = samekey_runtime::sqlx::postgres::PgPoolOptions::new()
                .max_connections(4)
                .acquire_timeout(std::time::Duration::from_secs(5))
                .connect(url)
                .await
                .map_err(|e| unreachable(&e))?;
            let migrated: bool = samekey_runtime::sqlx::query_scalar(
                "SELECT to_regclass('samekey_receipts') IS NOT NULL",
            )
            .fetch_one(&pool)
            .await
            .map_err(|e| unreachable(&e))?;
            if !migrated {
                return Err(never_migrated(url));
            }
            let store = samekey_runtime::store::PgStore::from_pool(pool);
            store.migrate().await.map_err(|e| unreachable(&e))?;
            return Ok(Arc::new(store));
        }
        #[cfg(not(feature = "postgres"))]
        return Err(Failure::usage(
            "this build has no PostgreSQL (feature `postgres`)",
        ));
    }
    if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        #[cfg(feature = "mysql")]
        {
            // sqlx reads `mysql://`; `mariadb://` names the same protocol.
            let url = match url.strip_prefix("mariadb://") {
                Some(rest) => format!("mysql://{rest}"),
                None => url.to_owned(),
            };
            let pool = samekey_runtime::sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(4)
                .acquire_timeout(std::time::Duration::from_secs(5))
                .connect(&url)
                .await
                .map_err(|e| unreachable(&e))?;
            let tables: i64 = samekey_runtime::sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.tables
                 WHERE table_schema = DATABASE() AND table_name = 'samekey_receipts'",
            )
            .fetch_one(&pool)
            .await
            .map_err(|e| unreachable(&e))?;
            if tables == 0 {
                return Err(never_migrated(&url));
            }
            let store = samekey_runtime::store::MySqlStore::from_pool(pool);
            store.migrate().await.map_err(|e| unreachable(&e))?;
            return Ok(Arc::new(store));
        }
        #[cfg(not(feature = "mysql"))]
        return Err(Failure::usage("this build has no MySQL (feature `mysql`)"));
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
        "{url:?} is not a store URL: sqlite:PATH, postgres://USER@HOST/DB, mysql://USER@HOST/DB, redis://HOST:PORT"
    )))
}
