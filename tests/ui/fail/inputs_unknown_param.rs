// `inputs` names what a compensation entry keeps: only the function's own parameters.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "order_id", inputs = "order_id, amonut")]
async fn charge(order_id: u64, amount: u64) -> Result<u64, PayError> {
    Ok(order_id + amount)
}

fn main() {}
