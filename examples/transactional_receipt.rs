//! The business row and the receipt in one PostgreSQL transaction (`docs/rules.md`, *Field lessons*): an order is
//! inserted and its receipt written with `PgStore::complete_in` before one `COMMIT`, so the two commit
//! or roll back together. A crash between them leaves neither: no order, and no `SUCCESS` receipt that
//! would make a retry replay an order that does not exist.
//!
//! ```text
//! eval "$(scripts/services start)"
//! cargo run --example transactional_receipt --features postgres
//! ```

use std::time::Duration;

use samekey::sqlx;
use samekey::store::PgStore;
use samekey::{idempotent, Classify, ErrorClass, ReceiptState, Runtime};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
enum OrderError {
    #[error("database: {0}")]
    Database(String),
    #[error("the process crashed before COMMIT")]
    Crashed,
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for OrderError {
    fn classify(&self) -> ErrorClass {
        match self {
            OrderError::Database(_) | OrderError::Crashed => ErrorClass::Unknown,
            OrderError::Samekey(e) => e.classify(),
        }
    }
}

fn db(e: impl std::fmt::Display) -> OrderError {
    OrderError::Database(e.to_string())
}

struct Orders {
    store: PgStore,
    samekey: Runtime,
}

impl Orders {
    #[idempotent(key = "order_id", scope = "example.orders.place", runtime = &self.samekey,
                 on_unknown = "hold")]
    async fn place(&self, order_id: i64, crash_before_commit: bool) -> Result<i64, OrderError> {
        let mut tx = self.store.pool().begin().await.map_err(db)?;
        sqlx::query("INSERT INTO example_orders (id) VALUES ($1)")
            .bind(order_id)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        PgStore::complete_in(&mut tx, &samekey::current(), &order_id)
            .await
            .map_err(|e| OrderError::Samekey(samekey::Error::Store(e)))?;
        if crash_before_commit {
            return Err(OrderError::Crashed); // the transaction is dropped: ROLLBACK
        }
        tx.commit().await.map_err(db)?;
        Ok(order_id)
    }

    async fn rows(&self, order_id: i64) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT COUNT(*) FROM example_orders WHERE id = $1")
            .bind(order_id)
            .fetch_one(self.store.pool())
            .await
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Ok(url) = std::env::var("SAMEKEY_PG_URL") else {
        println!("set SAMEKEY_PG_URL (eval \"$(scripts/services start)\") to run this example");
        return Ok(());
    };
    let store = PgStore::connect(&url).await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS example_orders (id BIGINT PRIMARY KEY)")
        .execute(store.pool())
        .await?;
    let orders = Orders {
        samekey: Runtime::builder()
            .store(store.clone())
            .lease(Duration::from_secs(5))
            .build()?,
        store,
    };
    let base = i64::try_from(samekey::TraceId::new().as_u128() >> 80)?;

    let committed = orders.place(base, false).await;
    println!(
        "order {base}: {committed:?}; rows: {}; again: {:?}",
        orders.rows(base).await?,
        orders.place(base, false).await
    );

    let crashed = base + 1;
    match orders.place(crashed, true).await {
        Err(OrderError::Samekey(samekey::Error::Unknown { call_id })) => {
            let receipt = orders.samekey.receipt(&call_id).await?;
            let state = receipt.map(|r| r.state);
            println!(
                "order {crashed}: crashed before COMMIT; rows: {}; receipt: {state:?}",
                orders.rows(crashed).await?
            );
            assert_eq!(state, Some(ReceiptState::Unknown), "no SUCCESS receipt");
        }
        other => println!("order {crashed}: unexpected {other:?}"),
    }
    Ok(())
}
