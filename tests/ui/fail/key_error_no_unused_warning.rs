// A refused key reports its error and nothing else: `op`, named only in the key, is not reported as
// an unused variable.
#![deny(warnings)]
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "ordr_id + op")]
async fn charge(order_id: u64, op: &str) -> Result<u64, PayError> {
    Ok(order_id)
}

fn main() {}
