// Group 2: in the string form the message names the part (rustc can only underline the whole
// string).
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "order_id + opp")]
async fn charge(order_id: u64, op: String) -> Result<u64, PayError> {
    let _ = op;
    Ok(order_id)
}

fn main() {}
