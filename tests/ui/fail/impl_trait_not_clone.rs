// An `impl Trait` argument is owned like any other: each attempt gets its own copy, so it must be
// `Clone`, and the message says so at the parameter.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

#[idempotent(key = "id")]
async fn note(id: u64, text: impl Into<String>) -> Result<u64, PayError> {
    let text: String = text.into();
    Ok(id + text.len() as u64)
}

fn main() {}
