// Group 3: a parameter declared `f64` gets the floats message on the part.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = order_id + amount)]
async fn charge(order_id: u64, amount: f64) -> Result<u64, PayError> {
    let _ = amount;
    Ok(order_id)
}

fn main() {}
