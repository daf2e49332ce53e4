// A budget names a dependency: 1 to 64 ASCII letters, digits, `_`, `-` or `.`.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "order_id", budget = "payments gateway")]
async fn charge(order_id: u64) -> Result<u64, PayError> {
    Ok(order_id)
}

#[idempotent(key = "order_id", budget = "")]
async fn refund(order_id: u64) -> Result<u64, PayError> {
    Ok(order_id)
}

fn main() {}
