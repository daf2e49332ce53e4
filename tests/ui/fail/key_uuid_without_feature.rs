// A `Uuid` key part without samekey's `uuid` feature: the message names the feature.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "request_id")]
async fn charge(request_id: uuid::Uuid) -> Result<u64, PayError> {
    Ok(request_id.as_u128() as u64)
}

fn main() {}
