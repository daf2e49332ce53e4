// Group 5: a ttl shorter than the worst-case retry span; the message shows both numbers.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "order_id", ttl = "1m", timeout = "20s", on_unknown = "rerun")]
async fn charge(order_id: u64) -> Result<u64, PayError> {
    Ok(order_id)
}

fn main() {}
