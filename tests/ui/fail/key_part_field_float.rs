// Group 4: a field whose type is not `KeyPart` (here `f64`) is caught by rustc on the part,
// with the message of `KeyPart`'s on_unimplemented.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = order.id + order.price)]
async fn charge(order: &Order) -> Result<u64, PayError> {
    Ok(order.id)
}

struct Order {
    id: u64,
    price: f64,
}

fn main() {}
