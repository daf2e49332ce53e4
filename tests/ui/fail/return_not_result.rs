// Group 1/4: a path return type that is not a `Result` passes the syntax check; the
// on_unimplemented message of the runtime's `CallResult` rejects it on the return type.
use samekey::idempotent;

#[idempotent(key = "order_id")]
async fn charge(order_id: u64) -> String {
    order_id.to_string()
}

fn main() {}
