// A `lookup` that returns the gateway's own status type instead of `samekey::RemoteStatus`: the
// message names the contract of `lookup` and points at the argument.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::{idempotent, CallId};

enum GatewayStatus {
    Charged,
}

async fn status(_call: &CallId) -> Result<GatewayStatus, String> {
    Ok(GatewayStatus::Charged)
}

#[idempotent(key = "order_id", timeout = "3s", lookup = status)]
async fn charge(order_id: u64) -> Result<u64, PayError> {
    Ok(order_id)
}

fn main() {}
