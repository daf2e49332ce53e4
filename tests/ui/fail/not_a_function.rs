// `#[idempotent]` on something that is not a function.
use samekey::idempotent;

#[idempotent(key = "id")]
struct Order {
    id: u64,
}

fn main() {}
