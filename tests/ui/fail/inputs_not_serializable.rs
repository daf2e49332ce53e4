// An input is kept encoded (serde): a type without `Serialize` is named where `inputs` names it.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[derive(Clone)]
struct Card {
    number: String,
}

#[idempotent(key = "order_id", inputs = "order_id, card")]
async fn charge(order_id: u64, card: Card) -> Result<u64, PayError> {
    Ok(order_id + card.number.len() as u64)
}

fn main() {}
