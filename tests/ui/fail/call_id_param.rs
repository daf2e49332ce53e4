// Group 3: a parameter declared as `CallId` is the callId too.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "order_id + call")]
async fn charge(order_id: u64, call: samekey::CallId) -> Result<u64, PayError> {
    let _ = call;
    Ok(order_id)
}

fn main() {}
