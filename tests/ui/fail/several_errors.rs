// Several problems are reported together, each at its own token, and nothing else (the function
// is kept as written, so there is no cascade of errors about it).
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = ordr + Utc::now(), retries = 11, jitter = -0.1, on_busy = "later")]
async fn charge(order: u64) -> Result<u64, PayError> {
    Ok(order)
}

fn main() {}
