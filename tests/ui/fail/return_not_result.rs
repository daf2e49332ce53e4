// Group 1/4: a return type that is certainly not a `Result` (`String`, `Option`, integers, …) is
// refused by the macro, once, on the return type.
use samekey::idempotent;

#[idempotent(key = "order_id")]
async fn charge(order_id: u64) -> String {
    order_id.to_string()
}

fn main() {}
