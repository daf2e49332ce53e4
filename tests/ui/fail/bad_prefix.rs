// The callId prefix must be 1 to 16 ASCII letters, digits or `_`.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "order_id", prefix = "pay-ment")]
async fn charge(order_id: u64) -> Result<u64, PayError> {
    Ok(order_id)
}

fn main() {}
