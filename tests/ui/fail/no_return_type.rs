// Group 1: a function without a return type is rejected: it must return `Result<T, E>`.
use samekey::idempotent;

#[idempotent(key = "order_id")]
async fn charge(order_id: u64) {
    let _ = order_id;
}

fn main() {}
