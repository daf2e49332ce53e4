//! A payment provider calls back three times — twice at once, once after a restart — and a late
//! "declined" arrives for a paid order: the receipt moves once, the order ships once, the backwards
//! callback is refused.
//!
//! ```sh
//! cargo run --example payment_callback                     # in memory (the restart shares the store)
//! cargo run --example payment_callback --features sqlite   # on an SQLite file, a real reopen
//! ```

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use samekey::{
    callback::Applied, callback::Callback, idempotent, CallId, Classify, ErrorClass, Runtime, Store,
};

#[derive(Debug, thiserror::Error)]
enum ShopError {
    #[error("the provider did not answer")]
    NoAnswer,
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for ShopError {
    fn classify(&self) -> ErrorClass {
        match self {
            ShopError::NoAnswer => ErrorClass::Unknown,
            ShopError::Samekey(e) => e.classify(),
        }
    }
}

struct Shop {
    samekey: Runtime,
    shipped: Arc<AtomicU32>,
}

impl Shop {
    /// The charge request: sent, and its reply lost. The provider charged, and will call back.
    #[idempotent(key = "order_id", scope = "shop.charge", runtime = &self.samekey, timeout = "2s",
                 on_unknown = "hold")]
    async fn charge(&self, order_id: &str, _cents: u64) -> Result<u64, ShopError> {
        Err(ShopError::NoAnswer)
    }

    /// Shipping, idempotent by the order: however many callbacks ask, it ships once.
    #[idempotent(key = "order_id", scope = "shop.ship", runtime = &self.samekey)]
    async fn ship(&self, order_id: &str) -> Result<u32, ShopError> {
        let parcel = self.shipped.fetch_add(1, Ordering::SeqCst) + 1;
        println!("  shipping order {order_id} (parcel #{parcel})");
        Ok(parcel)
    }

    /// The provider's callback handler: record the outcome, then ship (also after `AlreadyApplied`:
    /// a process that crashed between the two ships on the provider's next delivery).
    async fn on_callback(
        &self,
        call_id: &CallId,
        order_id: &str,
        paid_cents: Option<u64>,
    ) -> Result<Applied, ShopError> {
        let callback = match paid_cents {
            Some(cents) => Callback::succeeded(&cents)?,
            None => Callback::failed("card declined"),
        };
        let applied = self.samekey.apply_callback(call_id, callback).await?;
        if paid_cents.is_some() {
            self.ship(order_id).await?;
        }
        Ok(applied)
    }
}

/// Where the SQLite store lives, with the `sqlite` feature.
#[cfg(feature = "sqlite")]
fn db_path() -> std::path::PathBuf {
    std::env::temp_dir().join("samekey-payment-callback.db")
}

/// The store: a fresh SQLite file with the `sqlite` feature, else in memory.
async fn store() -> Result<Arc<dyn Store>, Box<dyn std::error::Error>> {
    #[cfg(feature = "sqlite")]
    {
        let _ = std::fs::remove_file(db_path());
        Ok(Arc::new(
            samekey::store::SqliteStore::open(db_path()).await?,
        ))
    }
    #[cfg(not(feature = "sqlite"))]
    {
        Ok(Arc::new(samekey::MemoryStore::new()))
    }
}

/// The store as a restarted process finds it: the SQLite file opened again, or (in memory) the same
/// store, which is what a durable one would keep.
async fn after_restart(
    store: Arc<dyn Store>,
) -> Result<Arc<dyn Store>, Box<dyn std::error::Error>> {
    #[cfg(feature = "sqlite")]
    {
        drop(store);
        Ok(Arc::new(
            samekey::store::SqliteStore::open(db_path()).await?,
        ))
    }
    #[cfg(not(feature = "sqlite"))]
    {
        Ok(store)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = store().await?;
    let shipped = Arc::new(AtomicU32::new(0));
    let shop = Arc::new(Shop {
        samekey: Runtime::builder()
            .node("shop-1")
            .shared_store(store.clone())
            .build()?,
        shipped: shipped.clone(),
    });

    let call_id = match shop.charge("o-42", 1_250).await {
        Err(ShopError::Samekey(samekey::Error::Unknown { call_id })) => call_id,
        other => return Err(format!("expected an unknown outcome, got {other:?}").into()),
    };
    println!("charge o-42: outcome unknown (call {call_id}); waiting for the provider's callback");

    println!("the provider calls back twice at once:");
    let (a, b) = tokio::join!(
        shop.on_callback(&call_id, "o-42", Some(1_250)),
        shop.on_callback(&call_id, "o-42", Some(1_250))
    );
    println!("  deliveries: {:?}, {:?}", a?, b?);

    println!("the shop restarts; the provider calls back again:");
    let restarted = Shop {
        samekey: Runtime::builder()
            .node("shop-2")
            .shared_store(after_restart(store).await?)
            .build()?,
        shipped: shipped.clone(),
    };
    let again = restarted.on_callback(&call_id, "o-42", Some(1_250)).await?;
    println!("  delivery: {again:?}");

    println!("a late \"declined\" arrives for the paid order:");
    match restarted.on_callback(&call_id, "o-42", None).await {
        Err(ShopError::Samekey(e @ samekey::Error::TransitionRefused { .. })) => {
            println!("  refused: {e}")
        }
        other => return Err(format!("expected a refusal, got {other:?}").into()),
    }

    let charged_again = restarted.charge("o-42", 1_250).await?;
    println!("a duplicate charge of o-42 replays the callback's outcome: {charged_again} cents");
    println!(
        "parcels shipped: {} (4 callbacks, 1 order)",
        shipped.load(Ordering::SeqCst)
    );
    assert_eq!(shipped.load(Ordering::SeqCst), 1);
    Ok(())
}
