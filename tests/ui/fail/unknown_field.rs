// Group 2: a field that does not exist is left to rustc, which points at it in the bare form.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = order.number)]
async fn charge(order: &Order) -> Result<u64, PayError> {
    Ok(order.id)
}

struct Order {
    id: u64,
}

fn main() {}
