// A type parameter that no parameter carries: `subscribe::<Basic>` and `subscribe::<Premium>` would be
// two operations under one default scope. The macro refuses to guess.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

pub trait Plan {
    const PRICE: u64;
}

#[idempotent(key = "user_id")]
async fn subscribe<P: Plan>(user_id: u64) -> Result<u64, PayError> {
    Ok(user_id * P::PRICE)
}

fn main() {}
