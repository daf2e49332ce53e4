//! MySQL or MariaDB: receipts in the caller's transaction ([`MySqlStore::complete_in`]), and fences
//! that never repeat across a purge. Needs `SAMEKEY_MYSQL_URL` (see `scripts/services`); without it
//! each test prints that it was skipped.
#![cfg(feature = "mysql")]

use std::time::Duration;

use samekey_runtime::at_most_once::AtMostOnce;
use samekey_runtime::sqlx;
use samekey_runtime::store::{Claim, Claimed, Completion, MySqlStore, Store};
use samekey_runtime::{CallId, Classify, Error, ErrorClass, Key, ReceiptState, Runtime};

async fn mysql() -> Option<MySqlStore> {
    let Ok(url) = std::env::var("SAMEKEY_MYSQL_URL") else {
        samekey_runtime::conformance::skipped(
            "set SAMEKEY_MYSQL_URL (scripts/services start) to run the MySQL tests",
        );
        return None;
    };
    Some(
        MySqlStore::connect(&url)
            .await
            .expect("connect to SAMEKEY_MYSQL_URL"),
    )
}

/// A name of this test run's own, so that runs and tests never see each other's rows.
fn unique(name: &str) -> String {
    format!(
        "{name}_{:016x}",
        samekey_runtime::TraceId::new().as_u128() as u64
    )
}

#[derive(Debug, thiserror::Error)]
enum ShopError {
    #[error("the connection was lost before COMMIT")]
    Reset,
    #[error("the database refused: {0}")]
    Db(String),
    #[error(transparent)]
    Samekey(#[from] Error),
}

impl Classify for ShopError {
    fn classify(&self) -> ErrorClass {
        match self {
            ShopError::Reset => ErrorClass::Unknown,
            ShopError::Db(_) => ErrorClass::Permanent,
            ShopError::Samekey(e) => e.classify(),
        }
    }
}

static PLACE: AtMostOnce = AtMostOnce::new("mysql_durability.place").retries(0);

/// What [`place`] does between writing its receipt and committing.
#[derive(Debug, Clone, Copy)]
enum BeforeCommit {
    Nothing,
    /// The body ends after both writes, before the COMMIT (the transaction is dropped: MySQL rolls
    /// it back, as it does for a process that died there).
    Crash,
    /// One more step (a statement, a call out) that takes this long, holding the receipt's row lock.
    Linger(Duration),
}

/// Writes the order row and the receipt in one transaction, then does `then` before the COMMIT.
async fn place(
    rt: &Runtime,
    store: &MySqlStore,
    orders: &str,
    id: u64,
    then: BeforeCommit,
) -> Result<u64, ShopError> {
    PLACE
        .key(&id)
        .runtime(rt)
        .run(|| async move {
            let db = |e: sqlx::Error| ShopError::Db(e.to_string());
            let mut tx = store.pool().begin().await.map_err(db)?;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {orders} (id) VALUES (?)"
            )))
            .bind(id as i64)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            MySqlStore::complete_in(&mut tx, &samekey_runtime::current(), &id)
                .await
                .map_err(|e| ShopError::Samekey(Error::Store(e)))?;
            match then {
                BeforeCommit::Nothing => {}
                BeforeCommit::Crash => {
                    drop(tx);
                    return Err(ShopError::Reset);
                }
                BeforeCommit::Linger(d) => tokio::time::sleep(d).await,
            }
            tx.commit().await.map_err(|_| ShopError::Reset)?;
            Ok(id)
        })
        .await
}

async fn order_rows(store: &MySqlStore, orders: &str, id: u64) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM {orders} WHERE id = ?"
    )))
    .bind(id as i64)
    .fetch_one(store.pool())
    .await
    .expect("count")
}

#[tokio::test]
async fn business_row_and_receipt_commit_or_roll_back_together() {
    let Some(store) = mysql().await else { return };
    let orders = unique("orders");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {orders} (id BIGINT PRIMARY KEY) ENGINE = InnoDB"
    )))
    .execute(store.pool())
    .await
    .expect("orders table");
    let rt = Runtime::builder().store(store.clone()).build().unwrap();

    // Committed: the order and the receipt, and a duplicate is a replay. Ids of this run only: the
    // database outlives test runs.
    let id = (samekey_runtime::TraceId::new().as_u128() >> 80) as u64;
    assert_eq!(
        place(&rt, &store, &orders, id, BeforeCommit::Nothing)
            .await
            .ok(),
        Some(id)
    );
    assert_eq!(order_rows(&store, &orders, id).await, 1);
    assert_eq!(
        place(&rt, &store, &orders, id, BeforeCommit::Nothing)
            .await
            .ok(),
        Some(id)
    );
    assert_eq!(
        order_rows(&store, &orders, id).await,
        1,
        "replayed, not run again"
    );

    // A crash between the two writes and the COMMIT leaves neither the order nor a SUCCESS receipt:
    // the call is UNKNOWN (for compensation), and the database shows it never happened.
    let other = id + 1_000_000;
    let out = place(&rt, &store, &orders, other, BeforeCommit::Crash).await;
    let Err(ShopError::Samekey(Error::Unknown { call_id })) = out else {
        panic!("expected Unknown, got {out:?}");
    };
    assert_eq!(
        order_rows(&store, &orders, other).await,
        0,
        "no business row"
    );
    let receipt = rt.receipt(&call_id).await.unwrap().expect("receipt");
    assert_eq!(receipt.state, ReceiptState::Unknown, "no SUCCESS receipt");

    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {orders}")))
        .execute(store.pool())
        .await
        .expect("drop the orders table");
}

/// Issue 38, defect 3: the call's lease is kept alive while it runs; its body writes the receipt
/// with `complete_in` and lingers before the COMMIT, past a renewal. The renewal's `UPDATE` waits for
/// the row lock the body's own transaction holds; the body is polled meanwhile and commits, and the
/// call ends at once — not after `innodb_lock_wait_timeout`.
#[tokio::test]
async fn a_renewal_never_waits_on_the_body_s_own_transaction() {
    let Some(store) = mysql().await else { return };
    let orders = unique("orders");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {orders} (id BIGINT PRIMARY KEY) ENGINE = InnoDB"
    )))
    .execute(store.pool())
    .await
    .expect("orders table");
    let rt = Runtime::builder()
        .store(store.clone())
        .lease(Duration::from_millis(600))
        .build()
        .unwrap();
    let id = (samekey_runtime::TraceId::new().as_u128() >> 80) as u64;
    let started = std::time::Instant::now();
    let linger = BeforeCommit::Linger(Duration::from_millis(700));
    let placed = tokio::time::timeout(
        Duration::from_secs(20),
        place(&rt, &store, &orders, id, linger),
    )
    .await
    .expect("the call hung: its renewal waited on its own transaction's row lock");
    assert_eq!(placed.ok(), Some(id));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the call waited {:?}: its renewal held it up",
        started.elapsed()
    );
    assert_eq!(order_rows(&store, &orders, id).await, 1);
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {orders}")))
        .execute(store.pool())
        .await
        .expect("drop the orders table");
}

/// A key whose row expired and was purged takes a fence above every fence it had: the purge raised
/// the fence floor first. (The server's clock judges expiry, so the test waits for it in real time.)
#[tokio::test]
async fn fences_never_repeat_across_a_purge() {
    let Some(store) = mysql().await else { return };
    let key = Key::build("mysql_durability", unique("fence").as_str());
    let claim = |now_ms| Claim {
        key: key.clone(),
        call_id: CallId::new("fen", "test").expect("a callId"),
        fingerprint: None,
        lease_ms: 10_000,
        now_ms,
    };
    let now = store.now_ms(0).await.expect("now");
    let Claimed::Acquired(first) = store.claim(claim(now)).await.expect("claim") else {
        panic!("a fresh key is acquired");
    };
    let done = Completion {
        state: ReceiptState::Success,
        outcome: Some(b"1".as_slice().into()),
        ttl_ms: 1,
    };
    store
        .complete(&key, first, done, now)
        .await
        .expect("complete");
    // Real time: the server's clock must pass the expiry.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let now = store.now_ms(0).await.expect("now");
    store.purge_expired(now).await.expect("purge");
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM samekey_receipts WHERE `key` = ?")
        .bind(key.digest().as_slice())
        .fetch_one(store.pool())
        .await
        .expect("count");
    assert_eq!(left, 0, "the row was purged");
    let Claimed::Acquired(second) = store.claim(claim(now)).await.expect("claim") else {
        panic!("a purged key is acquired");
    };
    assert!(second > first, "{second:?} after {first:?}");
}

/// A waiter on a busy key hears the owner's completion by polling (no `LISTEN` on MySQL): within
/// the poll's interval, which doubles from 20 ms to at most 1 s, so a wait of a few hundred ms hears
/// the outcome within as long again. Real time: the server's clock judges the lease.
#[tokio::test]
async fn a_waiter_hears_the_completion_by_polling() {
    let Some(store) = mysql().await else { return };
    let key = Key::build("mysql_durability", unique("wait").as_str());
    let now = store.now_ms(0).await.expect("now");
    let claimed = store
        .claim(Claim {
            key: key.clone(),
            call_id: CallId::new("wai", "test").expect("a callId"),
            fingerprint: None,
            lease_ms: 10_000,
            now_ms: now,
        })
        .await
        .expect("claim");
    let Claimed::Acquired(fence) = claimed else {
        panic!("a fresh key is acquired");
    };
    let owner = store.clone();
    let owner_key = key.clone();
    let started = std::time::Instant::now();
    let completing = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let done = Completion {
            state: ReceiptState::Success,
            outcome: Some(b"1".as_slice().into()),
            ttl_ms: 60_000,
        };
        owner
            .complete(&owner_key, fence, done, now)
            .await
            .expect("complete");
        std::time::Instant::now()
    });
    let heard = store
        .wait_settled(&key, Duration::from_secs(5), now)
        .await
        .expect("wait");
    let heard_at = std::time::Instant::now();
    let completed_at = completing.await.expect("join");
    assert_eq!(heard.map(|r| r.state), Some(ReceiptState::Success));
    let late = heard_at.saturating_duration_since(completed_at);
    println!(
        "completed {:?} into the wait, heard {late:?} later",
        completed_at - started
    );
    assert!(late < Duration::from_millis(600), "heard {late:?} late");
}
