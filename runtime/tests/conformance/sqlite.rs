//! The store conformance suite on SQLite, each test on a fresh database file.
//!
//! (Was `tests/sqlite_conformance.rs`.)
#![cfg(feature = "sqlite")]

use std::sync::Arc;

use samekey_runtime::store::SqliteStore;

async fn fresh() -> Arc<SqliteStore> {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "sqlite-conformance-{}",
        samekey_runtime::TraceId::new()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    Arc::new(
        SqliteStore::open(dir.join("receipts.db"))
            .await
            .expect("open SQLite"),
    )
}

samekey_runtime::store_conformance_tests!(fresh().await);

/// A file made by an earlier release, whose queue has no worker fence column, is migrated in place:
/// its queued entries keep their place and can be taken under a fence.
#[tokio::test]
async fn an_earlier_releases_queue_is_migrated() {
    use samekey_runtime::{compensation::CompensationEntry, receipt::Fence, CallId, Key, Store};
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "sqlite-migration-{}",
        samekey_runtime::TraceId::new()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("receipts.db");
    let old = sqlx_like_old_queue(&path).await;
    let store = SqliteStore::open(&path).await.expect("open and migrate");
    SqliteStore::open(&path)
        .await
        .expect("migrating twice changes nothing");
    let listed = store.list_compensations().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].call_id, old);
    assert_eq!(listed[0].fence, Fence(0));
    let taken = store
        .take_due_compensations(u64::MAX / 4, 10, 1_000)
        .await
        .expect("take");
    assert_eq!(taken[0].fence, Fence(1));
    let new = CallId::new("ord", "api-7").expect("callId");
    store
        .enqueue_compensation(CompensationEntry::new(
            new,
            Key::build("migrated", &1u8),
            "new",
            1,
        ))
        .await
        .expect("enqueue after the migration");
}

/// Writes the queue table as the previous release made it, with one entry, and answers its callId.
async fn sqlx_like_old_queue(path: &std::path::Path) -> samekey_runtime::CallId {
    use samekey_runtime::sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
    let pool = SqlitePoolOptions::new()
        .connect_with(
            SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true),
        )
        .await
        .expect("create the old file");
    samekey_runtime::sqlx::raw_sql(
        "CREATE TABLE samekey_compensation (
            call_id TEXT PRIMARY KEY NOT NULL, key BLOB NOT NULL, scope TEXT NOT NULL,
            reason TEXT NOT NULL, round INTEGER NOT NULL, next_at INTEGER NOT NULL,
            state TEXT NOT NULL, lease_until INTEGER, enqueued INTEGER NOT NULL
        ) WITHOUT ROWID;",
    )
    .execute(&pool)
    .await
    .expect("old schema");
    let id = samekey_runtime::CallId::new("old", "api-7").expect("callId");
    samekey_runtime::sqlx::query(
        "INSERT INTO samekey_compensation VALUES ($1, zeroblob(32), 'old', 'queued before', 0, 1, 'PENDING', NULL, 1)",
    )
    .bind(id.to_string())
    .execute(&pool)
    .await
    .expect("old entry");
    pool.close().await;
    id
}
