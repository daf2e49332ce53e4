// Group 2: a bare key part that names no parameter is underlined, with the closest parameter
// suggested.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = ordr.id + op)]
async fn charge(order: &Order, op: String) -> Result<u64, PayError> {
    let _ = op;
    Ok(order.id)
}

struct Order {
    id: u64,
}

fn main() {}
