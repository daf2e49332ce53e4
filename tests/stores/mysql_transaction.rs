//! MySQL and MariaDB: a receipt written in the caller's transaction (`MySqlStore::complete_in`) while
//! the call's lease is kept alive. Needs `SAMEKEY_MYSQL_URL` (see `scripts/services`); without it the
//! test prints that it was skipped.
#![cfg(feature = "mysql")]

use crate::support;

use std::time::Duration;

use samekey::sqlx;
use samekey::store::MySqlStore;
use samekey::{idempotent, Error, Runtime};
use support::TestError;

struct Shop {
    rt: Runtime,
    store: MySqlStore,
    orders: String,
}

impl Shop {
    /// Writes the order row and the receipt in one transaction, then lingers `linger` before the
    /// commit (one more statement, a call out), holding the receipt's row lock.
    #[idempotent(key = "order_id", runtime = &self.rt, on_unknown = "hold")]
    async fn place(&self, order_id: u64, linger: Duration) -> Result<u64, TestError> {
        let db = |_| TestError::Refused;
        let mut tx = self.store.pool().begin().await.map_err(db)?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {} (id) VALUES (?)",
            self.orders
        )))
        .bind(order_id)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        MySqlStore::complete_in(&mut tx, &samekey::current(), &order_id)
            .await
            .map_err(|e| TestError::Samekey(Error::Store(e)))?;
        tokio::time::sleep(linger).await;
        tx.commit().await.map_err(|_| TestError::Reset)?;
        Ok(order_id)
    }
}

/// Issue 38, defect 3, on MySQL: a body without `timeout` writes its receipt with `complete_in` and
/// lingers before `COMMIT`, past its lease's renewal. The renewal's `UPDATE` waits for the row lock
/// the body's own transaction holds; the body is polled meanwhile and commits, and the call ends at
/// once — not after `innodb_lock_wait_timeout`.
#[tokio::test]
async fn a_renewal_never_waits_on_the_body_s_own_transaction() {
    let Ok(url) = std::env::var("SAMEKEY_MYSQL_URL") else {
        samekey::conformance::skipped(
            "set SAMEKEY_MYSQL_URL (scripts/services start) to run the MySQL transaction test",
        );
        return;
    };
    let store = MySqlStore::connect(&url)
        .await
        .expect("connect to SAMEKEY_MYSQL_URL");
    let orders = format!("orders_{:016x}", samekey::TraceId::new().as_u128() as u64);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {orders} (id BIGINT UNSIGNED PRIMARY KEY)"
    )))
    .execute(store.pool())
    .await
    .expect("orders table");
    let shop = Shop {
        rt: Runtime::builder()
            .store(store.clone())
            .lease(Duration::from_millis(600))
            .build()
            .unwrap(),
        store,
        orders,
    };
    let id = (samekey::TraceId::new().as_u128() >> 80) as u64;
    let started = std::time::Instant::now();
    let placed = tokio::time::timeout(
        Duration::from_secs(20),
        shop.place(id, Duration::from_millis(700)),
    )
    .await
    .expect("the call hung: its renewal waited on its own transaction's row lock");
    assert_eq!(placed, Ok(id));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the call waited {:?}: its renewal held it up",
        started.elapsed()
    );
    assert_eq!(shop.place(id, Duration::ZERO).await, Ok(id));
    assert_eq!(shop.rt.stats().replays, 1);
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {}", shop.orders)))
        .execute(shop.store.pool())
        .await
        .expect("drop the orders table");
}
