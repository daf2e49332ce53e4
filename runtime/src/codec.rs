//! How a call's failure is stored and replayed: exactly with serde when the error type implements
//! `Serialize` and `Deserialize`, else by its message. (The success value is always stored with serde.)
//!
//! Real error types often hold what serde cannot (`#[from] reqwest::Error`, `sqlx::Error`,
//! `io::Error`). Such an error is stored as its `Display` text, and a duplicate gets
//! [`Error::Failed`](crate::Error::Failed) with that text through the function's
//! `From<samekey::Error>`: the same answer ("it failed, and why"), in the one variant the function
//! already handles. The choice is made per function, at compile time, by the code `#[idempotent]`
//! generates ([`Probe`]).

use std::fmt::Display;
use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// How one function's failures are written and read back.
pub struct ErrorCodec<E> {
    pub(crate) encode: fn(&E) -> serde_json::Result<Vec<u8>>,
    /// The stored failure: the error itself, or (`Err`) the message it was stored by.
    pub(crate) decode: fn(&[u8]) -> serde_json::Result<Result<E, String>>,
}

/// A failure stored by its message.
#[derive(Serialize, Deserialize)]
struct ByMessage {
    #[serde(rename = "samekey.failure")]
    message: String,
}

/// Picks a function's [`ErrorCodec`] by what its error type `E` implements:
/// `(&&Probe::<E>::new()).codec()` is the exact (serde) codec when `E` has serde, else the message
/// codec (method resolution tries [`ExactErrors`], implemented for `&Probe`, before
/// [`MessageErrors`]).
pub struct Probe<E>(PhantomData<fn() -> E>);

impl<E> Probe<E> {
    /// A probe for the error type `E`.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Probe<E> {
        Probe(PhantomData)
    }
}

/// The first choice of [`Probe`]: errors with serde are stored and replayed exactly.
pub trait ExactErrors<E> {
    /// The codec.
    fn codec(&self) -> ErrorCodec<E>;
}

impl<E: Serialize + DeserializeOwned> ExactErrors<E> for &Probe<E> {
    fn codec(&self) -> ErrorCodec<E> {
        ErrorCodec {
            encode: |e| serde_json::to_vec(e),
            // A failure stored by message (by a build whose error type had no serde) still replays.
            decode: |b| match serde_json::from_slice(b) {
                Ok(e) => Ok(Ok(e)),
                Err(e) => match serde_json::from_slice::<ByMessage>(b) {
                    Ok(stored) => Ok(Err(stored.message)),
                    Err(_) => Err(e),
                },
            },
        }
    }
}

/// The fallback of [`Probe`]: errors without serde are stored by their message.
pub trait MessageErrors<E> {
    /// The codec.
    fn codec(&self) -> ErrorCodec<E>
    where
        E: StoredByMessage;
}

impl<E> MessageErrors<E> for Probe<E> {
    fn codec(&self) -> ErrorCodec<E>
    where
        E: StoredByMessage,
    {
        ErrorCodec {
            encode: |e| {
                serde_json::to_vec(&ByMessage {
                    message: e.to_string(),
                })
            },
            decode: |b| {
                Ok(Err(match serde_json::from_slice::<ByMessage>(b) {
                    Ok(stored) => stored.message,
                    // Stored exactly by a build whose error type had serde: its JSON is the message.
                    Err(_) => String::from_utf8_lossy(b).into_owned(),
                }))
            },
        }
    }
}

/// An error type whose failures can be stored by their message: anything that implements `Display`.
#[diagnostic::on_unimplemented(
    message = "the failures of `{Self}` cannot be stored: it implements neither `Display` nor serde",
    label = "a permanent failure is stored and replayed to duplicates",
    note = "implement `Display` (e.g. `#[derive(thiserror::Error)]`): a duplicate then gets `samekey::Error::Failed` with the message, through your `From<samekey::Error>`",
    note = "or derive `serde::Serialize` and `serde::Deserialize`: a duplicate then gets the error itself"
)]
pub trait StoredByMessage: Display {}

#[diagnostic::do_not_recommend]
impl<E: Display> StoredByMessage for E {}
