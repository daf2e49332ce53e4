// Group 1: an owned `self` receiver is rejected: the body may run once per attempt.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

struct Service;

impl Service {
    #[idempotent(key = "order_id")]
    async fn charge(self, order_id: u64) -> Result<u64, PayError> {
        Ok(order_id)
    }
}

fn main() {}
