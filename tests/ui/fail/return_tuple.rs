// Group 1: a return type that is not a path (here a tuple) is rejected on the return type.
use samekey::idempotent;

#[idempotent(key = "order_id")]
async fn charge(order_id: u64) -> (u64, bool) {
    (order_id, true)
}

fn main() {}
