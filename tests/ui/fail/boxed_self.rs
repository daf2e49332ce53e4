// Group 1: `self: Box<Self>` is an owned receiver too.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

struct Service;

impl Service {
    #[idempotent(key = "order_id")]
    async fn charge(self: Box<Self>, order_id: u64) -> Result<u64, PayError> {
        Ok(order_id)
    }
}

fn main() {}
