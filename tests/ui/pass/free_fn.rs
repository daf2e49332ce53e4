// A free `async fn` with the string key form: owned and borrowed parameters, string and integer
// literal parts, `?` and an early `return` in the body, and a body that moves an owned parameter
// (each attempt gets its own clone).
#![deny(warnings)]
use samekey::{idempotent, Classify, ErrorClass};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
enum PayError {
    #[error("declined")]
    Declined,
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for PayError {
    fn classify(&self) -> ErrorClass {
        match self {
            PayError::Declined => ErrorClass::Permanent,
            PayError::Samekey(e) => e.classify(),
        }
    }
}

fn check(amount: u64) -> Result<u64, PayError> {
    if amount == 0 {
        Err(PayError::Declined)
    } else {
        Ok(amount)
    }
}

fn consume(note: String) -> usize {
    note.len()
}

#[idempotent(key = "order_id + op + \"charge\" + 1")]
pub async fn charge(order_id: &str, op: String, amount: u64, mut note: String) -> Result<u64, PayError> {
    let amount = check(amount)?;
    if amount > 1_000 {
        return Err(PayError::Declined);
    }
    note.push('!');
    let _ = consume(note);
    let _ = consume(op);
    Ok(amount)
}

fn main() {}
