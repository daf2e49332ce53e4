// Group 2: operators other than the `+` separator are rejected; the part is `amount - 1`.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = order_id + amount - 1)]
async fn charge(order_id: u64, amount: u64) -> Result<u64, PayError> {
    Ok(order_id + amount)
}

fn main() {}
