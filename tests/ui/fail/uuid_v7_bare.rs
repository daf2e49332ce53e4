// Group 3: `Uuid::now_v7` in the bare form (a per-call id, not taken for a clock).
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = order_id + uuid::Uuid::now_v7())]
async fn charge(order_id: u64) -> Result<u64, PayError> {
    Ok(order_id)
}

fn main() {}
