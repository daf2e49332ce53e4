// Group 2: with no close name, the message lists the parameters.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "order_id + tenant")]
async fn charge(order_id: u64, op: String) -> Result<u64, PayError> {
    let _ = op;
    Ok(order_id)
}

fn main() {}
