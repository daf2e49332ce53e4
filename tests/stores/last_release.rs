//! A database made by the last release (3f81a36, before issue 25 moved the SQL into `.sql` files):
//! opened by this one, it needs nothing (PostgreSQL takes no migration lock and rewrites no table),
//! what the old release wrote reads back and goes on (a claim of the old release taken over, completed
//! and replayed by this one), and the whole conformance suite passes on it.
//!
//! The old release's text is in `last_release/`, verbatim from `git show 3f81a36:…`: its PostgreSQL
//! `SCHEMA` (with its `time_columns!` list written in) and `LATER_INDEXES`, its SQLite `SCHEMA`, and
//! each dialect's `CLAIM_SQL` (the old statement writes the rows a new instance then finds).
//! (Review of issue 25, reviewer 2.)
#![cfg(any(feature = "postgres", feature = "sqlite"))]

use std::sync::Arc;

use samekey::store::{Claimed, Completion};
use samekey::{conformance, CallId, Key, ReceiptState, Store};

/// Every check of the conformance suite, by name, on `store` (checks may share a database: each
/// uses keys and callIds of its own).
async fn whole_suite(store: Arc<dyn Store>) {
    macro_rules! run {
        ($($check:ident)+) => {$(
            conformance::$check(store.clone()).await;
        )+};
    }
    run!(claim_is_exclusive claim_records_processing fences_grow complete_is_fenced_and_reentrant
        callback_transitions unknown_moves_forward release_frees_the_key forget_frees_a_finished_key
        receipts_are_found_by_call_ids take_over_rules extend_lease_is_fenced ttl_expiry
        wait_settled_wakes compensation_queue take_over_is_exclusive_and_fences_out
        wait_settled_wakes_on_release orphans_are_listed receipts_are_listed journal_is_kept_in_order
        journal_lives_with_its_record journaled_keys_are_listed receipts_are_paged);
}

fn success(payload: &'static [u8]) -> Completion {
    Completion {
        state: ReceiptState::Success,
        outcome: Some(Arc::from(payload)),
        ttl_ms: 3_600_000,
    }
}

/// The old release's claim left with an expired lease (`lease_ms` 0), then this release's take-over,
/// completion and replay of it; and the old release's live claim answered as held.
async fn old_claims_go_on(store: &dyn Store, expired: (&Key, &CallId), live: &Key, now: u64) {
    let held = store
        .get(expired.0, now)
        .await
        .expect("read")
        .expect("the old release's row");
    assert_eq!(held.state, ReceiptState::Processing);
    assert_eq!(&held.call_id, expired.1);
    let fence = match store
        .take_over(expired.0, held.fence, 60_000, now)
        .await
        .expect("take over")
    {
        Claimed::Acquired(fence) => fence,
        other => panic!("the old release's lapsed claim is taken over: {other:?}"),
    };
    assert!(fence > held.fence);
    store
        .complete(expired.0, fence, success(b"42"), now)
        .await
        .expect("complete");
    let done = store.get(expired.0, now).await.unwrap().unwrap();
    assert_eq!(done.state, ReceiptState::Success);
    assert_eq!(done.outcome.as_deref(), Some(&b"42"[..]));
    let claim = samekey::store::Claim {
        key: live.clone(),
        call_id: CallId::new("late", "n2").unwrap(),
        fingerprint: None,
        lease_ms: 60_000,
        now_ms: now,
    };
    match store.claim(claim).await.expect("claim") {
        Claimed::Existing(r) => assert_eq!(r.state, ReceiptState::Processing),
        other => panic!("the old release's live claim holds its key: {other:?}"),
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::str::FromStr;
    use std::sync::Arc;
    use std::time::Duration;

    use samekey::sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
    use samekey::sqlx::{self, AssertSqlSafe};
    use samekey::store::PgStore;
    use samekey::{CallId, Key, Store, TraceId};

    const OLD_SCHEMA: &str = include_str!("last_release/postgres_schema.sql");
    const OLD_LATER_INDEXES: &str = include_str!("last_release/postgres_later_indexes.sql");
    const OLD_CLAIM_SQL: &str = include_str!("last_release/postgres_claim.sql");

    async fn old_claim(pool: &PgPool, key: &Key, call_id: &CallId, lease_ms: i64) {
        let row = sqlx::query(OLD_CLAIM_SQL)
            .bind(key.digest().as_slice())
            .bind(key.scope())
            .bind(call_id.to_string())
            .bind(lease_ms)
            .bind(None::<Vec<u8>>)
            .bind(0i64)
            .fetch_one(pool)
            .await
            .expect("the old release's claim");
        let acquired: bool = sqlx::Row::get(&row, "acquired");
        assert!(acquired);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_postgres_database_of_the_last_release_needs_nothing_and_works() {
        let Ok(url) = std::env::var("SAMEKEY_PG_URL") else {
            samekey::conformance::skipped(
                "set SAMEKEY_PG_URL (scripts/services start) to run the last release's database",
            );
            return;
        };
        let schema = format!("samekey_last_{:x}", TraceId::new().as_u128() as u64);
        let admin = PgPoolOptions::new()
            .max_connections(2)
            .connect(&url)
            .await
            .expect("connect");
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&admin)
            .await
            .unwrap();
        let options = PgConnectOptions::from_str(&url)
            .unwrap()
            .options([("search_path", schema.as_str())]);
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .unwrap();

        // The last release's migration: its schema in one transaction, then each later index.
        let mut tx = pool.begin().await.unwrap();
        sqlx::raw_sql(OLD_SCHEMA).execute(&mut *tx).await.unwrap();
        tx.commit().await.unwrap();
        for index in OLD_LATER_INDEXES.split(';') {
            sqlx::raw_sql(AssertSqlSafe(index.to_owned()))
                .execute(&pool)
                .await
                .expect("an old later index");
        }
        let expired = (
            Key::build("last_release.pay", &1u8),
            CallId::new("pay", "n1").unwrap(),
        );
        let live = Key::build("last_release.pay", &2u8);
        old_claim(&pool, &expired.0, &expired.1, 0).await;
        old_claim(&pool, &live, &CallId::new("pay", "n1").unwrap(), 600_000).await;
        let files = |pool: PgPool| async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT pg_relation_filenode(to_regclass(t))::bigint FROM unnest(ARRAY[
                    'samekey_receipts', 'samekey_compensation', 'samekey_journal']) AS t",
            )
            .fetch_all(&pool)
            .await
            .unwrap()
        };
        let before = files(pool.clone()).await;

        // This release finds nothing to do: it migrates while another session holds the lock.
        let store = PgStore::from_pool(pool.clone());
        let mut holder = admin.acquire().await.unwrap();
        sqlx::query("SELECT pg_advisory_lock(hashtext('samekey.migrate'))")
            .execute(&mut *holder)
            .await
            .unwrap();
        let migrated = tokio::time::timeout(Duration::from_secs(5), store.migrate()).await;
        sqlx::query("SELECT pg_advisory_unlock(hashtext('samekey.migrate'))")
            .execute(&mut *holder)
            .await
            .unwrap();
        drop(holder);
        migrated
            .expect("the last release's database takes no migration lock")
            .expect("migrate");
        assert_eq!(files(pool.clone()).await, before, "no table rewritten");

        let now = store.now_ms(0).await.unwrap();
        super::old_claims_go_on(&store, (&expired.0, &expired.1), &live, now).await;
        super::whole_suite(Arc::new(store)).await;

        pool.close().await;
        sqlx::raw_sql(AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
            .execute(&admin)
            .await
            .unwrap();
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use std::sync::Arc;

    use samekey::sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
    use samekey::sqlx::{self, Row};
    use samekey::store::SqliteStore;
    use samekey::{CallId, Key, TraceId};

    const OLD_SCHEMA: &str = include_str!("last_release/sqlite_schema.sql");
    const OLD_CLAIM_SQL: &str = include_str!("last_release/sqlite_claim.sql");

    const NOW: u64 = 1_796_029_200_000;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_sqlite_file_of_the_last_release_needs_nothing_and_works() {
        let dir = std::env::temp_dir().join(format!("samekey-last-release-{}", TraceId::new()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("receipts.db");
        let expired = (
            Key::build("last_release.pay", &1u8),
            CallId::new("pay", "n1").unwrap(),
        );
        let live = Key::build("last_release.pay", &2u8);
        {
            // The last release's `SqliteStore::open`: its schema, then its claims.
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(
                    SqliteConnectOptions::new()
                        .filename(&path)
                        .create_if_missing(true),
                )
                .await
                .unwrap();
            sqlx::raw_sql(OLD_SCHEMA).execute(&pool).await.unwrap();
            for (key, lease) in [(&expired.0, 0i64), (&live, 600_000)] {
                let fence: Vec<i64> = sqlx::query_scalar(OLD_CLAIM_SQL)
                    .bind(key.digest().as_slice())
                    .bind(key.scope())
                    .bind(expired.1.to_string())
                    .bind((NOW as i64) << 16)
                    .bind(lease)
                    .bind(None::<Vec<u8>>)
                    .bind(NOW as i64)
                    .fetch_all(&pool)
                    .await
                    .unwrap();
                assert_eq!(fence, [(NOW as i64) << 16]);
            }
            let columns: Vec<String> =
                sqlx::query("SELECT name FROM pragma_table_info('samekey_compensation')")
                    .fetch_all(&pool)
                    .await
                    .unwrap()
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
            assert!(columns.contains(&"inputs".to_owned()), "{columns:?}");
            pool.close().await;
        }
        let store = SqliteStore::open(&path)
            .await
            .expect("open the last release's file");
        super::old_claims_go_on(&store, (&expired.0, &expired.1), &live, NOW + 1).await;
        super::whole_suite(Arc::new(store)).await;
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
