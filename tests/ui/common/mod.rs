//! An error type that `#[idempotent]` accepts, shared by the UI cases (`#[path]`-included).
#![allow(dead_code)]

use samekey::{Classify, ErrorClass};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
pub enum PayError {
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
