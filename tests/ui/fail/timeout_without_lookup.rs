// Group 5: a timeout with neither `lookup` nor `on_unknown`: what do we ask after a timeout?
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "order_id", timeout = "3s")]
async fn charge(order_id: u64) -> Result<u64, PayError> {
    Ok(order_id)
}

fn main() {}
