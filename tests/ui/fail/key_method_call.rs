// Group 3: calls of any kind are rejected in key parts (a method call with no known volatile
// source gets the generic message).
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = order.id.to_string() + op)]
async fn charge(order: &Order, op: String) -> Result<u64, PayError> {
    let _ = op;
    Ok(order.id)
}

struct Order {
    id: u64,
}

fn main() {}
