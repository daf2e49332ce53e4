// An alias the macro cannot see through: the on_unimplemented message of the runtime's `CallResult`
// rejects it on the return type.
use samekey::idempotent;

type Receipt = u64;

#[idempotent(key = "order_id")]
async fn charge(order_id: u64) -> Receipt {
    order_id
}

fn main() {}
