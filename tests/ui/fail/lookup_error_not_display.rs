// A `lookup` whose error type does not implement `Display`: the message names the contract of
// `lookup` and points at the argument, not into samekey.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::{idempotent, CallId, RemoteStatus};

#[derive(Debug)]
struct StatusDown;

async fn status(_call: &CallId) -> Result<RemoteStatus<u64, PayError>, StatusDown> {
    Err(StatusDown)
}

#[idempotent(key = "order_id", timeout = "3s", lookup = status)]
async fn charge(order_id: u64) -> Result<u64, PayError> {
    Ok(order_id)
}

fn main() {}
