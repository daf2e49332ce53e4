// Group 4: a user type without `KeyPart` in the string form: the error is on the key string.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "order")]
async fn charge(order: &Order) -> Result<u64, PayError> {
    Ok(order.id)
}

struct Order {
    id: u64,
}

fn main() {}
