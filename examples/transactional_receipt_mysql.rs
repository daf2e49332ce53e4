//! The business row and the receipt in one MySQL or MariaDB transaction (`docs/rules.md`, *Field lessons*), and a real
//! crash before `COMMIT`: an order is inserted and its receipt written with
//! `MySqlStore::complete_in`, then one `COMMIT` makes both durable. A second process of this example
//! does the same for another order and is killed (`SIGKILL`) after writing both, before its `COMMIT`:
//! the server rolls its transaction back, and neither the order nor a `SUCCESS` receipt is there.
//! Once the dead owner's lease has ended, the order placed again runs once, under the first callId.
//!
//! ```text
//! eval "$(scripts/services start)"
//! cargo run --example transactional_receipt_mysql --features mysql
//! ```

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::time::Duration;

use samekey::sqlx;
use samekey::store::MySqlStore;
use samekey::{idempotent, CallId, Classify, ErrorClass, ReceiptState, Runtime};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
enum OrderError {
    #[error("database: {0}")]
    Database(String),
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for OrderError {
    fn classify(&self) -> ErrorClass {
        match self {
            // A failed statement or COMMIT may or may not have committed: the outcome is unknown.
            OrderError::Database(_) => ErrorClass::Unknown,
            OrderError::Samekey(e) => e.classify(),
        }
    }
}

fn db(e: impl std::fmt::Display) -> OrderError {
    OrderError::Database(e.to_string())
}

struct Orders {
    store: MySqlStore,
    samekey: Runtime,
}

impl Orders {
    async fn open(url: &str) -> Result<Orders, Box<dyn std::error::Error>> {
        let store = MySqlStore::connect(url).await?;
        let samekey = Runtime::builder()
            .store(store.clone())
            // A dead owner's key is taken over 1 s after its last heartbeat (the server's clock).
            .lease(Duration::from_secs(1))
            .build()?;
        Ok(Orders { store, samekey })
    }

    /// Places an order: its row and its receipt commit together. A take-over after a crash runs it
    /// again under the recorded callId (`on_unknown = "rerun"`): the crash rolled back everything it
    /// wrote, and an owner only stalled, not dead, cannot commit after the take-over — its receipt
    /// write is fenced (and waits on the row lock the take-over holds, or holds it first), and its
    /// order row meets the primary key of the new owner's.
    #[idempotent(key = "order_id", scope = "example.orders.place", runtime = &self.samekey,
                 on_unknown = "rerun")]
    async fn place(&self, order_id: i64, crash_before_commit: bool) -> Result<i64, OrderError> {
        let mut tx = self.store.pool().begin().await.map_err(db)?;
        sqlx::query("INSERT INTO example_orders (id) VALUES (?)")
            .bind(order_id)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        let call = samekey::current();
        MySqlStore::complete_in(&mut tx, &call, &order_id)
            .await
            .map_err(|e| OrderError::Samekey(samekey::Error::Store(e)))?;
        if crash_before_commit {
            // The order row and the receipt are written, uncommitted: tell the parent, which kills
            // this process here.
            println!("written {}", call.call_id());
            let _ = std::io::stdout().flush();
            std::future::pending::<()>().await;
        }
        tx.commit().await.map_err(db)?;
        Ok(order_id)
    }

    async fn rows(&self, order_id: i64) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT COUNT(*) FROM example_orders WHERE id = ?")
            .bind(order_id)
            .fetch_one(self.store.pool())
            .await
    }
}

/// The child: places `order_id` and is killed before its `COMMIT`.
async fn crashing_child(url: &str, order_id: i64) -> Result<(), Box<dyn std::error::Error>> {
    let orders = Orders::open(url).await?;
    orders.place(order_id, true).await?;
    Err("the child was to be killed before COMMIT".into())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Ok(url) = std::env::var("SAMEKEY_MYSQL_URL") else {
        println!("set SAMEKEY_MYSQL_URL (eval \"$(scripts/services start)\") to run this example");
        return Ok(());
    };
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, order_id] = args.as_slice() {
        if flag == "--crash" {
            return crashing_child(&url, order_id.parse()?).await;
        }
    }

    let orders = Orders::open(&url).await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS example_orders (id BIGINT PRIMARY KEY)")
        .execute(orders.store.pool())
        .await?;
    let base = i64::try_from(samekey::TraceId::new().as_u128() >> 80)?;

    let committed = orders.place(base, false).await?;
    let again = orders.place(base, false).await?;
    let rows = orders.rows(base).await?;
    println!("order {base}: placed {committed}, again {again} (replayed); rows: {rows}");
    assert_eq!(rows, 1);

    // Another process places the next order and is killed after writing the row and the receipt,
    // before COMMIT.
    let crashed = base + 1;
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--crash", &crashed.to_string()])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or("the child's stdout")?).read_line(&mut line)?;
    let call_id: CallId = line
        .strip_prefix("written ")
        .ok_or_else(|| format!("the child said {line:?}"))?
        .trim()
        .parse()?;
    child.kill()?;
    child.wait()?;
    let state = orders.samekey.receipt(&call_id).await?.map(|r| r.state);
    let rows = orders.rows(crashed).await?;
    println!("order {crashed}: its process killed before COMMIT; rows: {rows}; receipt: {state:?}");
    assert_eq!(rows, 0, "no order row");
    assert_eq!(
        state,
        Some(ReceiptState::Processing),
        "the claim, and no SUCCESS receipt"
    );

    // The dead owner's lease ends; the order placed again takes the key over and runs once.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let placed = orders.place(crashed, false).await?;
    let receipt = orders.samekey.receipt(&call_id).await?;
    let rows = orders.rows(crashed).await?;
    println!(
        "order {crashed}: placed again {placed}; rows: {rows}; receipt: {:?} under {call_id}",
        receipt.as_ref().map(|r| r.state)
    );
    assert_eq!(rows, 1, "one order row");
    assert_eq!(receipt.map(|r| r.state), Some(ReceiptState::Success));
    Ok(())
}
