//! How an error decides what happens next: [`Classify`] sorts errors into [`ErrorClass`]es, and
//! [`RemoteStatus`] is what a receipt lookup on the remote side answers.

use std::time::Duration;

/// What an error says about the call that produced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Retrying cannot help (validation, authorization, 4xx): no retry; the receipt becomes `FAILED` and
    /// duplicates get the same error.
    Permanent,
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
    /// (the request may have arrived); everything else is permanent.
    fn classify(&self) -> ErrorClass {
        use std::io::ErrorKind::*;
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
