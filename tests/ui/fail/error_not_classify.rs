// Group 4: the error type must implement `samekey::Classify`, serde and `From<samekey::Error>`.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[derive(Debug)]
struct PlainError;

#[idempotent(key = "order_id")]
async fn charge(order_id: u64) -> Result<u64, PlainError> {
    let _ = PayError::Declined;
    Ok(order_id)
}

fn main() {}
