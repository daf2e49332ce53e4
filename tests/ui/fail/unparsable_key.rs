// Group 2: a key string that is not parts joined with `+` (here a comma) is rejected.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "order_id, op")]
async fn charge(order_id: u64, op: String) -> Result<u64, PayError> {
    let _ = op;
    Ok(order_id)
}

fn main() {}
