//! Replays on the in-process store keep a `Clone` result decoded: the first replay decodes the
//! stored JSON and keeps a copy beside the receipt, later ones clone it. What a duplicate gets does
//! not change — the same value, a `verify` mismatch still refused, a forgotten key's copy gone with
//! its receipt — and a result type without `Clone` is decoded every time.

use std::sync::atomic::{AtomicU32, Ordering};

use samekey::{idempotent, observe::observed, Error, Key, Runtime};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error, Serialize, Deserialize, PartialEq)]
enum ShopError {
    #[error("{0}")]
    Samekey(String),
    #[error("key reused with other inputs")]
    KeyReuse,
}

impl samekey::Classify for ShopError {
    fn classify(&self) -> samekey::ErrorClass {
        samekey::ErrorClass::Permanent
    }
}

impl From<Error> for ShopError {
    fn from(e: Error) -> ShopError {
        match e {
            Error::KeyReuse { .. } => ShopError::KeyReuse,
            other => ShopError::Samekey(other.to_string()),
        }
    }
}

/// Counts its clones: a replay answered from the kept copy clones it once.
static CLONES: AtomicU32 = AtomicU32::new(0);

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order: String,
    amount: u64,
}

impl Clone for Receipt {
    fn clone(&self) -> Receipt {
        CLONES.fetch_add(1, Ordering::SeqCst);
        Receipt {
            order: self.order.clone(),
            amount: self.amount,
        }
    }
}

/// No `Clone`: decoded on every replay.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Plain {
    amount: u64,
}

struct Shop {
    rt: Runtime,
    runs: AtomicU32,
}

impl Shop {
    fn new() -> Shop {
        Shop {
            rt: Runtime::builder().node("kept").build().unwrap(),
            runs: AtomicU32::new(0),
        }
    }

    #[idempotent(key = "order", verify = "amount", scope = "kept.charge", runtime = &self.rt)]
    async fn charge(&self, order: &str, amount: u64) -> Result<Receipt, ShopError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(Receipt {
            order: order.to_owned(),
            amount,
        })
    }

    #[idempotent(key = "order", scope = "kept.plain", runtime = &self.rt)]
    async fn plain(&self, order: &str, amount: u64) -> Result<Plain, ShopError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(Plain { amount })
    }
}

#[tokio::test]
async fn a_clone_result_is_kept_decoded_and_replays_unchanged() {
    let shop = Shop::new();
    let first = shop.charge("o-1", 500).await.unwrap();
    let expected = Receipt {
        order: "o-1".to_owned(),
        amount: 500,
    };
    assert_eq!(first, expected);
    let before = CLONES.load(Ordering::SeqCst);
    // The first replay decodes and keeps a copy (one clone), each later one clones the copy.
    for n in 1..=5 {
        assert_eq!(shop.charge("o-1", 500).await.unwrap(), expected);
        assert_eq!(CLONES.load(Ordering::SeqCst) - before, n, "replay {n}");
    }
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);

    // A duplicate with other inputs is still refused, kept copy or not.
    assert_eq!(shop.charge("o-1", 999).await, Err(ShopError::KeyReuse));

    // Forgotten, the key runs again and replays its new result, not the old copy.
    let key = Key::build("kept.charge", "o-1");
    shop.rt.forget(&key, "test", "redo").await.unwrap();
    let (again, report) = observed(shop.charge("o-1", 700)).await;
    assert_eq!(again.unwrap().amount, 700);
    assert!(!report.unwrap().replayed());
    assert_eq!(shop.charge("o-1", 700).await.unwrap().amount, 700);
    assert_eq!(shop.charge("o-1", 700).await.unwrap().amount, 700);
    assert_eq!(shop.runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_result_without_clone_is_decoded_on_every_replay() {
    let shop = Shop::new();
    assert_eq!(shop.plain("o-2", 300).await, Ok(Plain { amount: 300 }));
    for _ in 0..3 {
        assert_eq!(shop.plain("o-2", 999).await, Ok(Plain { amount: 300 }));
    }
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
}
