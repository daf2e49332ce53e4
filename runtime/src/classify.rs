//! How an error decides what happens next: [`Classify`] sorts errors into [`ErrorClass`]es, and
//! [`RemoteStatus`] is what a receipt lookup on the remote side answers.

use std::time::Duration;

/// What an error says about the call that produced it.
///
/// | class | retried | the key afterwards | use it for |
/// |---|---|---|---|
/// | `Permanent` | no | `FAILED`: duplicates get this error for the key's `ttl` | a final answer that must stand: the operation was refused after it may have changed something, or the caller must not try again under this key |
/// | `Rejected` | no | released: the same key may be tried again at once | a refusal that changed nothing (card declined, validation failed, insufficient funds), where the customer may fix it and try the same operation again |
/// | `Retryable` | yes, backoff | released if every attempt failed so | known **not** to have taken effect (connection refused, 503 before processing) |
/// | `RateLimited` | yes, after `retry_after` | released if every attempt failed so | 429 / throttling: the request was not executed |
/// | `Unknown` | only after `lookup` says "not received" | `UNKNOWN` and queued, if nothing settles it | a timeout or a reset after sending: it may have happened |
///
/// After an attempt whose outcome was unknown, a `Permanent` or `Rejected` answer may only mean "you
/// already did that": with a `lookup`, the call asks the receipt first (a receipt that knows nothing of
/// the callId confirms the refusal, which is then recorded); without one, the answer is recorded
/// `FAILED`. Either way it is never released, since the first attempt may have taken effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Retrying cannot help, and the answer stands (the operation may have changed something, or must
    /// not be tried again under this key): no retry; the receipt becomes `FAILED` and duplicates get
    /// the same error until the key expires.
    Permanent,
    /// Refused, and **nothing took effect** (a declined card, a failed validation): no retry, and the
    /// claim is released instead of stored, so the same key may be tried again (with another card).
    /// The caller gets this error; nothing is replayed.
    Rejected,
    /// The call is known **not** to have taken effect (connection refused, 503 before processing): back
    /// off and retry with the same callId.
    Retryable,
    /// The remote asked us to slow down; it did not execute. Wait at least `retry_after` (when given),
    /// then retry; it counts as an attempt.
    RateLimited {
        /// The wait the remote asked for.
        retry_after: Option<Duration>,
    },
    /// The outcome is not known (timeout, reset after sending): ask the receipt before anything else.
    Unknown,
}

/// Sorts an error into an [`ErrorClass`]. The error type of an `#[idempotent]` function implements it.
///
/// ```
/// use samekey_runtime::{Classify, ErrorClass};
/// enum PayError { Declined, Busy, Timeout }
/// impl Classify for PayError {
///     fn classify(&self) -> ErrorClass {
///         match self {
///             PayError::Declined => ErrorClass::Permanent,
///             PayError::Busy => ErrorClass::Retryable,
///             PayError::Timeout => ErrorClass::Unknown,
///         }
///     }
/// }
/// ```
pub trait Classify {
    /// The class of this error.
    fn classify(&self) -> ErrorClass;
}

impl Classify for std::io::Error {
    /// Refusals before anything was sent are retryable; timeouts and broken connections are unknown
    /// (the request may have arrived); everything else is permanent. An `io::Error` made from a
    /// [`samekey::Error`](crate::Error) (`From`) keeps that error's class.
    fn classify(&self) -> ErrorClass {
        use std::io::ErrorKind::*;
        if let Some(samekey) = self
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<crate::Error>())
        {
            return samekey.classify();
        }
        match self.kind() {
            ConnectionRefused | NotConnected | AddrNotAvailable | WouldBlock => {
                ErrorClass::Retryable
            }
            TimedOut | ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof
            | Interrupted => ErrorClass::Unknown,
            _ => ErrorClass::Permanent,
        }
    }
}

/// The remote side's answer to "what happened to this callId?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteStatus<T, E> {
    /// The remote never received the call: it may be executed (again) with the same callId.
    NotReceived,
    /// The remote is still working on it: wait and ask again.
    Processing,
    /// It took effect with this result.
    Succeeded(T),
    /// It failed for good with this error.
    Failed(E),
}
