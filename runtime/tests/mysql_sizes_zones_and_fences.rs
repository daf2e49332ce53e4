//! `MySqlStore` keeps what it is given and whom it belongs to: scopes of any length and script
//! byte for byte, an outcome too large for the server left `UNKNOWN` (never run twice), leases that a
//! non-UTC session or a skewed caller cannot stretch, fences that keep growing through a purge, and
//! a stale owner's transaction told it is fenced out. Each test says in its doc comment what was
//! found and how it was fixed (FIXED), or that the attempt held (HELD).
//!
//! Needs `SAMEKEY_MYSQL_URL`; keys are this run's own (the database is shared with the other MySQL
//! tests, as in `mysql_durability.rs`).
#![cfg(feature = "mysql")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use samekey_runtime::at_most_once::AtMostOnce;
use samekey_runtime::sqlx::mysql::MySqlPoolOptions;
use samekey_runtime::sqlx::{self, AssertSqlSafe, Executor as _};
use samekey_runtime::store::{Claim, Claimed, Completion, MySqlStore, Store, StoreError};
use samekey_runtime::{CallId, Classify, Error, ErrorClass, Key, ReceiptState, Runtime};

fn url() -> Option<String> {
    match std::env::var("SAMEKEY_MYSQL_URL") {
        Ok(url) => Some(url),
        Err(_) => {
            samekey_runtime::conformance::skipped(
                "set SAMEKEY_MYSQL_URL to run the MySQL review tests",
            );
            None
        }
    }
}

/// The store on a pool whose every connection first runs `setup` (a session setting, as a server
/// configured that way gives every session).
async fn store_with(url: &str, setup: Option<&'static str>) -> MySqlStore {
    let pool = MySqlPoolOptions::new()
        .max_connections(8)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if let Some(setup) = setup {
                    conn.execute(AssertSqlSafe(setup)).await?;
                }
                Ok(())
            })
        })
        .connect(url)
        .await
        .expect("connect to SAMEKEY_MYSQL_URL");
    let store = MySqlStore::from_pool(pool);
    store.migrate().await.expect("migrate");
    store
}

fn unique(name: &str) -> String {
    format!(
        "review28_{name}_{:016x}",
        samekey_runtime::TraceId::new().as_u128() as u64
    )
}

fn claim(key: &Key, lease_ms: u64, now_ms: u64) -> Claim {
    Claim {
        key: key.clone(),
        call_id: CallId::new("rev", "review28").expect("a callId"),
        fingerprint: None,
        lease_ms,
        now_ms,
    }
}

#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
enum ReviewError {
    #[error("{0}")]
    Db(String),
    #[error(transparent)]
    Samekey(#[from] Error),
}

impl Classify for ReviewError {
    fn classify(&self) -> ErrorClass {
        match self {
            ReviewError::Db(_) => ErrorClass::Permanent,
            ReviewError::Samekey(e) => e.classify(),
        }
    }
}

static STALE: AtMostOnce = AtMostOnce::new("review28.stale_owner").retries(0);

/// FIXED (was FINDING, low: the refusal's reason read from the transaction's old snapshot; now a
/// locking read, the dialect's `refused_row`). A stalled owner whose transaction read anything before the take-over (a plain
/// `SELECT`: under InnoDB's default `REPEATABLE READ` that fixes the transaction's snapshot) and then
/// calls `MySqlStore::complete_in` is refused — good — but with
/// `InvalidTransition { from: PROCESSING, to: SUCCESS }`, not the documented `StoreError::Fenced`
/// ("Refused with `StoreError::Fenced` when another owner took the key over: then roll back"). The
/// refused `UPDATE` is a locking read of the latest row, but the read that explains the refusal
/// (`row_on`, in the caller's transaction) is a consistent read of the old snapshot, which still
/// shows the stale owner's own fence and `PROCESSING`. Code that matches on `Fenced` to roll back
/// misses it, and the message ("cannot move from PROCESSING to SUCCESS") misleads whoever reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_completing_in_its_transaction_is_told_fenced() {
    let Some(url) = url() else { return };
    let store = store_with(&url, None).await;
    let rt = Runtime::builder().store(store.clone()).build().unwrap();
    let seen: Arc<Mutex<Option<Result<samekey_runtime::receipt::Transition, StoreError>>>> =
        Arc::default();
    let id = unique("stale");
    let out: Result<u32, ReviewError> = tokio::time::timeout(
        Duration::from_secs(30),
        STALE.key(id.as_str()).runtime(&rt).run(|| {
            let store = store.clone();
            let seen = seen.clone();
            async move {
                let db = |e: sqlx::Error| ReviewError::Db(e.to_string());
                let call = samekey_runtime::current();
                let key = call.key().clone();
                let mut tx = store.pool().begin().await.map_err(db)?;
                // The business transaction reads first (stock, a price…): its snapshot is now.
                let _: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM samekey_receipts WHERE `key` = ?")
                    .bind(key.digest().as_slice())
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db)?;
                // The owner stalls; its lease ends by the server's clock and another node takes over.
                sqlx::query(
                    "UPDATE samekey_receipts SET lease_until = UTC_TIMESTAMP(3) - INTERVAL 1 SECOND \
                     WHERE `key` = ?",
                )
                .bind(key.digest().as_slice())
                .execute(store.pool())
                .await
                .map_err(db)?;
                let now = store.now_ms(0).await.map_err(|e| ReviewError::Samekey(Error::Store(e)))?;
                let taken = store
                    .take_over(&key, call.fence(), 60_000, now)
                    .await
                    .map_err(|e| ReviewError::Samekey(Error::Store(e)))?;
                let Claimed::Acquired(new_fence) = taken else {
                    panic!("the take-over should succeed: {taken:?}");
                };
                // The stalled owner wakes up and writes its receipt in its transaction.
                let answer = MySqlStore::complete_in(&mut tx, &call, &1u32).await;
                *seen.lock().unwrap() = Some(answer);
                drop(tx); // rolled back
                // The new owner finishes, so that the stale call has something to replay.
                store
                    .complete(
                        &key,
                        new_fence,
                        Completion {
                            state: ReceiptState::Success,
                            outcome: Some(b"2".as_slice().into()),
                            ttl_ms: 60_000,
                        },
                        now,
                    )
                    .await
                    .map_err(|e| ReviewError::Samekey(Error::Store(e)))?;
                Ok(1u32)
            }
        }),
    )
    .await
    .expect("the call ends");
    let seen = seen.lock().unwrap().take();
    println!("the call answered {out:?}; complete_in answered {seen:?}");
    assert!(
        matches!(seen, Some(Err(StoreError::Fenced { .. }))),
        "complete_in after a take-over: {seen:?}"
    );
}

/// FIXED (was: `samekey_receipts.scope` a `VARCHAR(512)`, and a claim under a longer scope — the
/// HTTP layer's scope is the raw path when no route matched — failed with error 1406, or was
/// truncated without a strict mode). The scope is a `TEXT` now, indexed by its SHA-256: a claim
/// under a long scope is taken, and its receipt listed by that scope.
#[tokio::test]
async fn a_scope_of_any_length_is_claimed_and_listed_byte_for_byte() {
    let Some(url) = url() else { return };
    let store = store_with(&url, None).await;
    let scope = format!("http:POST /files/{}", "dir/".repeat(130));
    assert!(scope.len() > 512);
    let key = Key::build(&scope, unique("scope").as_str());
    let now = store.now_ms(0).await.unwrap();
    let claimed = store.claim(claim(&key, 10_000, now)).await;
    assert!(
        matches!(claimed, Ok(Claimed::Acquired(_))),
        "claim under a {}-byte scope: {claimed:?}",
        scope.len()
    );
    let query = samekey_runtime::store::ReceiptQuery::created_between(0, u64::MAX >> 2)
        .scope(scope.as_str());
    let listed = store.list_receipts(&query, now).await.unwrap().receipts;
    assert!(listed.iter().any(|r| r.key == key), "{listed:?}");
    // Another scope that only adds a trailing space is another scope (no PAD SPACE).
    let spaced = store
        .list_receipts(&query.clone().scope(format!("{scope} ")), now)
        .await
        .unwrap()
        .receipts;
    assert!(spaced.is_empty(), "{spaced:?}");
}

/// DOCUMENTED (was a finding: a bound nobody had written down). A result larger than the server's
/// `max_allowed_packet` (16 MiB on MariaDB 10.11, 64 MiB on MySQL 8 by default) cannot be
/// recorded: the completion's `UPDATE` is refused. The first caller still gets its value, the body
/// ran once, and the record is left `UNKNOWN` (queued for compensation): a duplicate is answered
/// `Error::Unknown`, never run again. `MySqlStore`'s documentation states the bound and what to do.
#[tokio::test]
async fn an_outcome_over_max_allowed_packet_is_left_unknown_never_run_twice() {
    let Some(url) = url() else { return };
    let store = store_with(&url, None).await;
    let packet: u64 = sqlx::query_scalar("SELECT @@max_allowed_packet")
        .fetch_one(store.pool())
        .await
        .unwrap();
    static BIG: AtMostOnce = AtMostOnce::new("review28.big_outcome").retries(0);
    let rt = Runtime::builder().store(store.clone()).build().unwrap();
    let size = usize::try_from(packet).unwrap() + 1024;
    let id = unique("big");
    let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let call = || {
        let runs = runs.clone();
        BIG.key(id.as_str()).runtime(&rt).run(move || {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok::<String, ReviewError>("x".repeat(size))
            }
        })
    };
    let first = call().await;
    let again = call().await;
    let runs = runs.load(std::sync::atomic::Ordering::SeqCst);
    println!(
        "max_allowed_packet {packet}; first: {:?}; again: {:?}; runs {runs}",
        first.as_ref().map(String::len),
        again.as_ref().map(String::len)
    );
    assert_eq!(runs, 1, "run once");
    assert_eq!(
        first.as_ref().map(String::len).ok(),
        Some(size),
        "{:?}",
        first.err()
    );
    assert!(
        matches!(again, Err(ReviewError::Samekey(Error::Unknown { .. }))),
        "{:?}",
        again.map(|v| v.len())
    );
}

/// HELD (and FIXED: the second review saw the purge fail with a deadlock against the claims about
/// one run in six; the purge now gives way and runs again on a lock conflict). Claims racing a purge: a key whose record expires over and over, and is taken again (an
/// expired row) or claimed anew (a purged one) while another task purges in a loop, gets fences
/// that only ever grow (the floor is raised before the delete, and the delete spares rows above it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_fences_grow_while_claims_race_a_purge() {
    let Some(url) = url() else { return };
    let store = store_with(&url, None).await;
    let key = Key::build("review28.purge_race", unique("race").as_str());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let purger = tokio::spawn({
        let store = store.clone();
        let stop = stop.clone();
        async move {
            let mut purged = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                purged += store.purge_expired(0).await.expect("purge");
                tokio::task::yield_now().await;
            }
            purged
        }
    });
    let mut fences = Vec::new();
    for _ in 0..60 {
        let claimed = store.claim(claim(&key, 10_000, 0)).await.expect("claim");
        let Claimed::Acquired(fence) = claimed else {
            panic!("an expired or purged key is acquired: {claimed:?}");
        };
        fences.push(fence.0);
        store
            .complete(
                &key,
                fence,
                Completion {
                    state: ReceiptState::Success,
                    outcome: Some(b"1".as_slice().into()),
                    ttl_ms: 1,
                },
                0,
            )
            .await
            .expect("complete");
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let purged = purger.await.unwrap();
    println!("fences {fences:?}; rows purged meanwhile {purged}");
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences never repeat: {fences:?}"
    );
}

/// HELD. A session whose `time_zone` is not UTC and a caller whose clock is hours off change
/// nothing: the record's times are the server's UTC (`created_ms` within seconds of the store's
/// clock), and a live lease is not taken over by a caller that believes it ended.
#[tokio::test]
async fn held_a_non_utc_session_and_a_skewed_caller_agree_on_leases() {
    let Some(url) = url() else { return };
    let store = store_with(&url, Some("SET time_zone = '+09:30'")).await;
    let system_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let server_ms = store.now_ms(0).await.unwrap();
    assert!(
        server_ms.abs_diff(system_ms) < 5_000,
        "the store's clock is UTC: {server_ms} vs {system_ms}"
    );
    let key = Key::build("review28.tz", unique("tz").as_str());
    let skewed = system_ms + 3 * 3_600_000;
    let Claimed::Acquired(fence) = store.claim(claim(&key, 10_000, skewed)).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    let record = store.get(&key, skewed).await.unwrap().expect("record");
    assert!(
        record.created_ms.abs_diff(server_ms) < 5_000,
        "created {} vs server {server_ms}",
        record.created_ms
    );
    let other = store_with(&url, Some("SET time_zone = '-07:00'")).await;
    let taken = other
        .take_over(&key, fence, 10_000, skewed + 86_400_000)
        .await
        .unwrap();
    assert!(
        matches!(taken, Claimed::Existing(ref r) if r.fence == fence),
        "the lease is alive by the server's clock: {taken:?}"
    );
}

/// HELD. A scope in Chinese with an emoji (4-byte UTF-8) is stored and read back exactly, through
/// the claim's hexadecimal literals (`CONVERT(X'…' USING utf8mb4)`).
#[tokio::test]
async fn held_a_unicode_scope_round_trips() {
    let Some(url) = url() else { return };
    let store = store_with(&url, None).await;
    let scope = "订单.支付🙂'; --";
    let key = Key::build(scope, unique("uni").as_str());
    let now = store.now_ms(0).await.unwrap();
    let Claimed::Acquired(_) = store.claim(claim(&key, 10_000, now)).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    let record = store.get(&key, now).await.unwrap().expect("record");
    assert_eq!(record.key.scope(), scope);
}

// ---------------------------------------------------------------------------------------------
// Second pass (review28b).
// ---------------------------------------------------------------------------------------------

/// The store in a database of this test's own (dropped by the caller with `DROP DATABASE`), every
/// connection first running `setup`.
async fn own_store(
    url: &str,
    name: &str,
    setup: &'static str,
) -> (MySqlStore, sqlx::MySqlPool, String) {
    use std::str::FromStr as _;
    let database = unique(&format!("b_{name}"));
    let admin = MySqlPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .unwrap();
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {database}")))
        .execute(&admin)
        .await
        .unwrap();
    let options = samekey_runtime::sqlx::mysql::MySqlConnectOptions::from_str(url)
        .unwrap()
        .database(&database);
    let pool = MySqlPoolOptions::new()
        .max_connections(8)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                conn.execute(AssertSqlSafe(setup)).await?;
                Ok(())
            })
        })
        .connect_with(options)
        .await
        .unwrap();
    let store = MySqlStore::from_pool(pool);
    store.migrate().await.expect("migrate");
    (store, admin, database)
}

/// FIXED (scope is a `MEDIUMTEXT` now: 16 MiB, beyond any packet a claim can send). Was: FINDING
/// (low; a scope over 65 535 bytes — `TEXT`'s bound, not "any length" as documented). On a
/// server whose `sql_mode` is not strict the scope is cut at 65 535 bytes without an error: the
/// receipt's key (a digest of the whole scope) is right, but the record names another scope, so the
/// listing by its scope does not find it and its compensation entry (also `TEXT`) names an
/// operation no worker runs. In strict mode the same claim fails with error 1406. (`MEDIUMTEXT`, or
/// a refusal before writing as the outbox's `TooLong`, would hold.)
#[tokio::test]
async fn a_scope_over_64_kib_is_kept_whole_or_refused() {
    let Some(url) = url() else { return };
    let (store, admin, database) = own_store(
        &url,
        "scope64k",
        "SET SESSION sql_mode = 'NO_ENGINE_SUBSTITUTION'",
    )
    .await;
    let scope = format!("http:GET /{}", "a/".repeat(33_000));
    assert!(scope.len() > 65_535);
    let key = Key::build(&scope, unique("s64").as_str());
    let now = store.now_ms(0).await.unwrap();
    let claimed = store.claim(claim(&key, 10_000, now)).await;
    let stored = store.get(&key, now).await;
    let query = samekey_runtime::store::ReceiptQuery::created_between(0, u64::MAX >> 2)
        .scope(scope.as_str());
    let listed = store
        .list_receipts(&query, now)
        .await
        .map(|l| l.receipts.len());
    store.pool().close().await;
    let _ = sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {database}")))
        .execute(&admin)
        .await;
    let stored_len = stored
        .as_ref()
        .ok()
        .and_then(|r| r.as_ref())
        .map(|r| r.key.scope().len());
    assert!(
        claimed.is_err() || (stored_len == Some(scope.len()) && matches!(listed, Ok(1))),
        "a {}-byte scope: claimed {:?}; stored scope {stored_len:?} bytes; listed by it: {listed:?}",
        scope.len(),
        claimed.map(|_| "acquired")
    );
}
