// A `window` longer than the `ttl`: the record would expire inside its window, and a second call in the
// same window would run again.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "user_id", window = "7d", ttl = "1d")]
async fn weekly_bonus(user_id: u64) -> Result<u64, PayError> {
    Ok(user_id)
}

fn main() {}
