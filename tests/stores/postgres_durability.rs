//! PostgreSQL: receipts in the caller's transaction, two OS processes racing on the same keys, and a
//! server that cannot be reached. Needs `SAMEKEY_PG_URL` (see `scripts/services`); without it each test
//! prints that it was skipped.
#![cfg(feature = "postgres")]

use crate::support;

use std::sync::atomic::{AtomicU32, Ordering};

use samekey::sqlx;
use samekey::store::PgStore;
use samekey::{idempotent, store::StoreError, Error, ReceiptState, Runtime};
use support::TestError;

async fn pg() -> Option<PgStore> {
    let Ok(url) = std::env::var("SAMEKEY_PG_URL") else {
        samekey::conformance::skipped(
            "set SAMEKEY_PG_URL (scripts/services start) to run the PostgreSQL tests",
        );
        return None;
    };
    Some(
        PgStore::connect(&url)
            .await
            .expect("connect to SAMEKEY_PG_URL"),
    )
}

/// A table of this test run's own, so that runs and tests never see each other's rows.
fn table(name: &str) -> String {
    format!("{name}_{:016x}", samekey::TraceId::new().as_u128() as u64)
}

/// What [`Shop::place`] does between writing its receipt and committing.
#[derive(Debug, Clone, Copy)]
enum BeforeCommit {
    Nothing,
    /// Fails: the connection is lost, the transaction rolls back.
    Fail,
    /// Lingers this long, past its lease's next renewal.
    Linger(std::time::Duration),
}

struct Shop {
    rt: Runtime,
    store: PgStore,
    orders: String,
}

impl Shop {
    /// Writes the order row and the receipt in one transaction, then does `then` before the commit.
    #[idempotent(key = "order_id", runtime = &self.rt, on_unknown = "hold")]
    async fn place(&self, order_id: u64, then: BeforeCommit) -> Result<u64, TestError> {
        let db = |_| TestError::Refused;
        let mut tx = self.store.pool().begin().await.map_err(db)?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {} (id) VALUES ($1)",
            self.orders
        )))
        .bind(order_id as i64)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        PgStore::complete_in(&mut tx, &samekey::current(), &order_id)
            .await
            .map_err(|e| TestError::Samekey(Error::Store(e)))?;
        match then {
            BeforeCommit::Nothing => {}
            // The connection is lost before COMMIT: the transaction rolls back.
            BeforeCommit::Fail => return Err(TestError::Reset),
            // One more step (a statement, a call out) while the transaction holds the row lock.
            BeforeCommit::Linger(d) => tokio::time::sleep(d).await,
        }
        tx.commit().await.map_err(|_| TestError::Reset)?;
        Ok(order_id)
    }

    async fn order_rows(&self, order_id: u64) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {} WHERE id = $1",
            self.orders
        )))
        .bind(order_id as i64)
        .fetch_one(self.store.pool())
        .await
        .expect("count")
    }
}

#[tokio::test]
async fn business_row_and_receipt_commit_or_roll_back_together() {
    let Some(store) = pg().await else { return };
    let orders = table("orders");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {orders} (id BIGINT PRIMARY KEY)"
    )))
    .execute(store.pool())
    .await
    .expect("orders table");
    let shop = Shop {
        rt: Runtime::builder().store(store.clone()).build().unwrap(),
        store,
        orders,
    };

    // Committed: both the order and the receipt, and a duplicate is a replay.
    // Ids of this run only: the database outlives test runs.
    let id = (samekey::TraceId::new().as_u128() >> 80) as u64;
    assert_eq!(shop.place(id, BeforeCommit::Nothing).await, Ok(id));
    assert_eq!(shop.order_rows(id).await, 1);
    assert_eq!(shop.place(id, BeforeCommit::Nothing).await, Ok(id));
    assert_eq!(shop.rt.stats().replays, 1);

    // A failure between the two writes and the commit leaves neither the order nor a SUCCESS receipt:
    // the call is UNKNOWN (for compensation), and the database shows it never happened.
    let other = id + 1_000_000;
    let out = shop.place(other, BeforeCommit::Fail).await;
    let Err(TestError::Samekey(Error::Unknown { call_id })) = out else {
        panic!("expected Unknown, got {out:?}");
    };
    assert_eq!(shop.order_rows(other).await, 0, "no business row");
    let receipt = shop.rt.receipt(&call_id).await.unwrap().expect("receipt");
    assert_eq!(receipt.state, ReceiptState::Unknown, "no SUCCESS receipt");
}

/// Issue 38, defect 3: a body without `timeout` keeps its lease alive; it writes its receipt with
/// `complete_in` and lingers before `COMMIT`, past a renewal. The renewal's `UPDATE` waits for the row
/// lock the body's own transaction holds; the body is polled meanwhile, commits, and the renewal
/// then goes through: the call ends, it does not hang.
#[tokio::test]
async fn a_renewal_never_waits_on_the_body_s_own_transaction() {
    let Some(store) = pg().await else { return };
    let orders = table("orders");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {orders} (id BIGINT PRIMARY KEY)"
    )))
    .execute(store.pool())
    .await
    .expect("orders table");
    let shop = Shop {
        rt: Runtime::builder()
            .store(store.clone())
            .lease(std::time::Duration::from_millis(600))
            .build()
            .unwrap(),
        store,
        orders,
    };
    let id = (samekey::TraceId::new().as_u128() >> 80) as u64;
    let linger = BeforeCommit::Linger(std::time::Duration::from_millis(700));
    let placed = tokio::time::timeout(std::time::Duration::from_secs(20), shop.place(id, linger))
        .await
        .expect("the call hung: its renewal waited on its own transaction's row lock");
    assert_eq!(placed, Ok(id));
    assert_eq!(shop.order_rows(id).await, 1);
    assert_eq!(shop.place(id, BeforeCommit::Nothing).await, Ok(id));
    assert_eq!(shop.rt.stats().replays, 1);
}

const KEYS: u64 = 200;

/// The worker half of the cross-process test: runs only when started by the parent test with
/// `SAMEKEY_WORKER_TABLE` set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_process() {
    let (Ok(effects), Ok(url)) = (
        std::env::var("SAMEKEY_WORKER_TABLE"),
        std::env::var("SAMEKEY_PG_URL"),
    ) else {
        return;
    };
    struct Worker {
        rt: Runtime,
        store: PgStore,
        effects: String,
        scope_tag: String,
    }
    impl Worker {
        #[idempotent(key = "scope_tag + key", scope = "race", runtime = &self.rt)]
        async fn effect(&self, scope_tag: &str, key: u64) -> Result<u32, TestError> {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {} (key, pid) VALUES ($1, $2)",
                self.effects
            )))
            .bind(key as i64)
            .bind(i64::from(std::process::id()))
            .execute(self.store.pool())
            .await
            .map_err(|_| TestError::Refused)?;
            Ok(std::process::id())
        }
    }
    let store = PgStore::connect(&url).await.expect("connect");
    let worker = Worker {
        rt: Runtime::builder().store(store.clone()).build().unwrap(),
        store,
        scope_tag: effects.clone(),
        effects,
    };
    for key in support::race::worker_keys(KEYS).await {
        worker.effect(&worker.scope_tag, key).await.expect("call");
    }
}

#[tokio::test]
async fn two_processes_race_and_each_key_runs_once() {
    let Some(store) = pg().await else { return };
    let effects = table("effects");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {effects} (key BIGINT NOT NULL, pid BIGINT NOT NULL)"
    )))
    .execute(store.pool())
    .await
    .expect("effects table");
    support::race::run_two_workers(
        "postgres_durability::worker_process",
        &[("SAMEKEY_WORKER_TABLE", &effects)],
    );
    let rows: Vec<(i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT key, COUNT(*) FROM {effects} GROUP BY key ORDER BY key"
    )))
    .fetch_all(store.pool())
    .await
    .expect("effects");
    let pids: Vec<(i64,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT DISTINCT pid FROM {effects}"
    )))
    .fetch_all(store.pool())
    .await
    .expect("pids");
    support::race::assert_each_key_ran_once(&rows, pids.len(), KEYS);
}

#[tokio::test]
async fn an_unreachable_server_fails_closed() {
    // Port 1 on loopback: nothing listens there.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_secs(2))
        .connect_lazy("postgres://samekey@127.0.0.1:1/samekey")
        .expect("lazy pool");
    struct Svc {
        rt: Runtime,
        runs: AtomicU32,
    }
    impl Svc {
        #[idempotent(key = "id", runtime = &self.rt)]
        async fn run(&self, id: u64) -> Result<u64, TestError> {
            self.runs.fetch_add(1, Ordering::SeqCst);
            Ok(id)
        }
    }
    let svc = Svc {
        rt: Runtime::builder()
            .store(PgStore::from_pool(pool))
            .build()
            .unwrap(),
        runs: AtomicU32::new(0),
    };
    let out = svc.run(1).await;
    assert!(
        matches!(
            out,
            Err(TestError::Samekey(Error::Store(StoreError::Unavailable(_))))
        ),
        "{out:?}"
    );
    assert_eq!(svc.runs.load(Ordering::SeqCst), 0, "nothing ran");
}
