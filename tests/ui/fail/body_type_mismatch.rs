// Group 4: each attempt is pinned to the declared return type, so a body of the wrong type is
// reported against the body and `-> Result<...>`, not against generated code.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "order_id")]
async fn charge(order_id: u64) -> Result<u64, PayError> {
    Ok(order_id.to_string())
}

fn main() {}
