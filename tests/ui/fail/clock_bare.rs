// Group 3: a clock in the bare form is underlined.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = order_id + std::time::Instant::now().elapsed().as_secs())]
async fn charge(order_id: u64) -> Result<u64, PayError> {
    Ok(order_id)
}

fn main() {}
