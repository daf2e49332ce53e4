// Group 3: a parameter whose type is a `HashMap` (here behind a reference) gets the hash-order
// message.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

use std::collections::HashMap;

#[idempotent(key = "order_id + lines")]
async fn charge(order_id: u64, lines: &HashMap<String, u32>) -> Result<u64, PayError> {
    let _ = lines;
    Ok(order_id)
}

fn main() {}
