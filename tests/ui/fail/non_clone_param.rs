// Group 4: an owned parameter that is not `Clone` is rejected at its type: the body may run once
// per attempt.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "order.id")]
async fn charge(order: Order) -> Result<u64, PayError> {
    Ok(order.id)
}

struct Order {
    id: u64,
}

fn main() {}
