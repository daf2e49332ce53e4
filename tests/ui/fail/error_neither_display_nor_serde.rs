// An error type that `Classify`es and converts from samekey's errors, but can be stored neither
// exactly (serde) nor by its message (`Display`).
use samekey::{idempotent, Classify, ErrorClass};

#[derive(Debug)]
enum PayError {
    Samekey(samekey::Error),
}

impl Classify for PayError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Permanent
    }
}

impl From<samekey::Error> for PayError {
    fn from(e: samekey::Error) -> Self {
        PayError::Samekey(e)
    }
}

#[idempotent(key = "order_id")]
async fn charge(order_id: u64) -> Result<u64, PayError> {
    Ok(order_id)
}

fn main() {}
