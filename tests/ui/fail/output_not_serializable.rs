// Group 4: the success type is stored and replayed, so it must implement serde's traits.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[derive(Debug)]
struct Charge {
    cents: u64,
}

#[idempotent(key = "order_id")]
async fn charge(order_id: u64) -> Result<Charge, PayError> {
    Ok(Charge { cents: order_id })
}

fn main() {}
