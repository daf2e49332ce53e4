// A `lookup` given as a function of `&str`: it is called with `&CallId`. (A closure, `|call|
// status(call)`, compiles: the `&CallId` derefs to the callId's text.)
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::{idempotent, RemoteStatus};

async fn status(_call: &str) -> Result<RemoteStatus<u64, PayError>, String> {
    Ok(RemoteStatus::NotReceived)
}

#[idempotent(key = "order_id", timeout = "3s", lookup = status)]
async fn charge(order_id: u64) -> Result<u64, PayError> {
    Ok(order_id)
}

fn main() {}
