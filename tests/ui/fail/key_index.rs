// Group 2: indexing is rejected in key parts.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "ids[0]")]
async fn charge(ids: Vec<u64>) -> Result<u64, PayError> {
    Ok(ids[0])
}

fn main() {}
