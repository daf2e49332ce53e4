// Group 3: a parameter declared `Instant` points to `window = ...`.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = order_id + at)]
async fn charge(order_id: u64, at: std::time::Instant) -> Result<u64, PayError> {
    let _ = at;
    Ok(order_id)
}

fn main() {}
