// Group 3: a counter (`fetch_add`).
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[idempotent(key = order_id + NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst))]
async fn charge(order_id: u64) -> Result<u64, PayError> {
    Ok(order_id)
}

fn main() {}
