// Group 5: the default ttl (24h) is checked too, reported at the argument that stretches the
// retry span.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "order_id", retries = 10, backoff = "1h..6h")]
async fn charge(order_id: u64) -> Result<u64, PayError> {
    Ok(order_id)
}

fn main() {}
