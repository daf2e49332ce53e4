// Group 3: `verify` parts get the same checks, and the message says `verify`.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "order_id", verify = "amount + SystemTime::now()")]
async fn charge(order_id: u64, amount: u64) -> Result<u64, PayError> {
    Ok(order_id + amount)
}

fn main() {}
