//! gRPC statuses in samekey's terms (feature `tonic`): the class of a [`tonic::Status`] by the gRPC
//! status-code guide, and a samekey [`Error`] as a `Status`, so that an `#[idempotent]` function may
//! return `Result<T, tonic::Status>`. (These impls live here, not in `samekey-grpc`, because of the
//! orphan rule: `Classify` and `Error` are this crate's.)

use std::time::Duration;

use tonic::{Code, Status};

use crate::{Classify, Error, ErrorClass};

/// The metadata key samekey-grpc's client layer adds to a status it received from a method whose
/// protobuf `idempotency_level` (or the call's own choice) lets a failure be resent.
pub const IDEMPOTENCY_LEVEL: &str = "samekey-idempotency-level";
/// The metadata key of a status made from a samekey [`Error`]: that error's class, so that it is kept
/// when the status is passed up through an outer call.
pub const ERROR_CLASS: &str = "samekey-error-class";
/// gRFC A6's server pushback: the milliseconds a server asks its client to wait before a retry (a
/// negative or unreadable value: do not retry).
pub const RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";

/// A method's protobuf `idempotency_level` (`google.protobuf.MethodOptions`): whether sending it again
/// after a failure whose outcome is unknown can change anything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum IdempotencyLevel {
    /// The default: the method may have side effects, and resending it may repeat them.
    #[default]
    Unknown,
    /// The method changes nothing (a read): resending it is always safe.
    NoSideEffects,
    /// The method's effect is the same however often it runs (a `PUT`-like write).
    Idempotent,
}

impl IdempotencyLevel {
    /// The protobuf enum's value (`MethodOptions.IdempotencyLevel`) as a level.
    pub fn from_proto(value: i32) -> IdempotencyLevel {
        match value {
            1 => IdempotencyLevel::NoSideEffects,
            2 => IdempotencyLevel::Idempotent,
            _ => IdempotencyLevel::Unknown,
        }
    }

    /// Its name in the [`IDEMPOTENCY_LEVEL`] metadata entry.
    pub fn as_str(self) -> &'static str {
        match self {
            IdempotencyLevel::Unknown => "unknown",
            IdempotencyLevel::NoSideEffects => "no-side-effects",
            IdempotencyLevel::Idempotent => "idempotent",
        }
    }

    fn parse(text: &str) -> IdempotencyLevel {
        match text {
            "no-side-effects" => IdempotencyLevel::NoSideEffects,
            "idempotent" => IdempotencyLevel::Idempotent,
            _ => IdempotencyLevel::Unknown,
        }
    }

    /// Whether resending the method cannot repeat an effect.
    pub fn safe_to_resend(self) -> bool {
        self != IdempotencyLevel::Unknown
    }
}

/// The wait a status's `grpc-retry-pushback-ms` asks for: `Some(Some(wait))`, `Some(None)` for "do not
/// retry" (negative or unreadable), `None` without one.
pub fn pushback(status: &Status) -> Option<Option<Duration>> {
    let value = status.metadata().get(RETRY_PUSHBACK_MS)?;
    Some(
        value
            .to_str()
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .map(Duration::from_millis),
    )
}

/// The class of a gRPC status code for a method of `level`, with the server's pushback (see
/// [`pushback`]), by the gRPC status-code guide:
///
/// | code | class | why |
/// |---|---|---|
/// | `UNAVAILABLE` | `Retryable` (`RateLimited` with a pushback) | the request did not reach the application |
/// | `RESOURCE_EXHAUSTED` | `RateLimited`, waiting the pushback | a quota or limit refused it before it ran |
/// | `ABORTED` with a pushback | `RateLimited` | "come back later" (samekey-grpc's answer to a key in flight) |
/// | `ABORTED` without | `Rejected` | a concurrency conflict: nothing took effect, retry at a higher level |
/// | `DEADLINE_EXCEEDED`, `CANCELLED`, `UNKNOWN`, `INTERNAL`, `DATA_LOSS` | `Unknown` | the method may have run: ask the receipt |
/// | `INVALID_ARGUMENT`, `NOT_FOUND`, `PERMISSION_DENIED`, `UNAUTHENTICATED`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `UNIMPLEMENTED` | `Rejected` | refused before it took effect: the key is given back for a corrected request |
/// | `ALREADY_EXISTS` | `Permanent` | the thing exists: the answer stands |
///
/// For a method whose level is `NO_SIDE_EFFECTS` or `IDEMPOTENT`, the uncertain codes but `DATA_LOSS`
/// (`DEADLINE_EXCEEDED`, `CANCELLED`, `UNKNOWN`, `INTERNAL`) and `ABORTED` are `Retryable`: sending it
/// again cannot repeat an effect. A pushback that says "do not retry" makes a code that would be
/// retried `Rejected`. `OK` (not a failure) is `Permanent`, as no code to retry.
pub fn classify_code(
    code: Code,
    level: IdempotencyLevel,
    pushback: Option<Option<Duration>>,
) -> ErrorClass {
    let resend = level.safe_to_resend();
    let waiting = |otherwise: ErrorClass| match pushback {
        Some(Some(wait)) => ErrorClass::RateLimited {
            retry_after: Some(wait),
        },
        Some(None) => ErrorClass::Rejected,
        None => otherwise,
    };
    match code {
        Code::Unavailable => waiting(ErrorClass::Retryable),
        Code::ResourceExhausted => waiting(ErrorClass::RateLimited { retry_after: None }),
        Code::Aborted if pushback.is_some() => waiting(ErrorClass::Rejected),
        Code::Aborted if resend => ErrorClass::Retryable,
        Code::Aborted => ErrorClass::Rejected,
        Code::DeadlineExceeded | Code::Cancelled | Code::Unknown | Code::Internal if resend => {
            ErrorClass::Retryable
        }
        Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Unknown
        | Code::Internal
        | Code::DataLoss => ErrorClass::Unknown,
        Code::InvalidArgument
        | Code::NotFound
        | Code::PermissionDenied
        | Code::Unauthenticated
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented => ErrorClass::Rejected,
        Code::AlreadyExists | Code::Ok => ErrorClass::Permanent,
    }
}

/// By [`classify_code`]: the level is the one samekey-grpc's client layer marked on the status
/// ([`IDEMPOTENCY_LEVEL`]; none: `Unknown`), the pushback its `grpc-retry-pushback-ms`. A status made
/// from a samekey [`Error`] keeps that error's class ([`ERROR_CLASS`]).
impl Classify for Status {
    fn classify(&self) -> ErrorClass {
        let metadata = self.metadata();
        if let Some(class) = metadata.get(ERROR_CLASS).and_then(|v| v.to_str().ok()) {
            match class {
                "unknown" => return ErrorClass::Unknown,
                "permanent" => return ErrorClass::Permanent,
                _ => {}
            }
        }
        let level = metadata
            .get(IDEMPOTENCY_LEVEL)
            .and_then(|v| v.to_str().ok())
            .map(IdempotencyLevel::parse)
            .unwrap_or_default();
        classify_code(self.code(), level, pushback(self))
    }
}

/// A samekey error as a gRPC status: `FAILED_PRECONDITION` for a key reused with another request,
/// `ABORTED` for a key in progress, `UNKNOWN` for an unknown outcome or a failing store,
/// `RESOURCE_EXHAUSTED` when overloaded, `UNAVAILABLE` when exhausted, `INVALID_ARGUMENT` for a missing
/// or invalid key part, `FAILED_PRECONDITION` otherwise; the message is the error's. The status carries
/// the error's class in [`ERROR_CLASS`] metadata, so that an outer call that gets it classifies it as
/// samekey did (never "not executed" for an error passed up from a nested call).
impl From<Error> for Status {
    fn from(error: Error) -> Status {
        let code = match &error {
            Error::KeyReuse { .. } => Code::FailedPrecondition,
            Error::InProgress { .. } => Code::Aborted,
            Error::Unknown { .. } | Error::Store(_) => Code::Unknown,
            Error::Overloaded { .. } => Code::ResourceExhausted,
            Error::Exhausted { .. } => Code::Unavailable,
            Error::MissingKey { .. } | Error::InvalidKey { .. } => Code::InvalidArgument,
            _ => Code::FailedPrecondition,
        };
        let class = match error.classify() {
            ErrorClass::Unknown => "unknown",
            _ => "permanent",
        };
        let mut status = Status::new(code, error.to_string());
        status.metadata_mut().insert(
            ERROR_CLASS,
            tonic::metadata::MetadataValue::from_static(class),
        );
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_samekey_error_keeps_its_class_as_a_status() {
        let call_id = crate::CallId::new("pay", "n1").expect("a callId");
        for error in [
            Error::Unknown {
                call_id: call_id.clone(),
            },
            Error::InProgress {
                call_id: call_id.clone(),
            },
            Error::Exhausted {
                call_id: call_id.clone(),
                attempts: 3,
            },
            Error::KeyReuse { call_id },
        ] {
            let class = error.classify();
            let status = Status::from(error);
            assert_eq!(status.classify(), class, "{status:?}");
        }
    }

    #[test]
    fn pushback_and_levels_change_the_class() {
        let mut status = Status::resource_exhausted("slow down");
        status
            .metadata_mut()
            .insert(RETRY_PUSHBACK_MS, "250".parse().expect("a value"));
        assert_eq!(
            status.classify(),
            ErrorClass::RateLimited {
                retry_after: Some(Duration::from_millis(250))
            }
        );
        status
            .metadata_mut()
            .insert(RETRY_PUSHBACK_MS, "-1".parse().expect("a value"));
        assert_eq!(status.classify(), ErrorClass::Rejected);
        let mut internal = Status::internal("boom");
        assert_eq!(internal.classify(), ErrorClass::Unknown);
        internal.metadata_mut().insert(
            IDEMPOTENCY_LEVEL,
            "no-side-effects".parse().expect("a value"),
        );
        assert_eq!(internal.classify(), ErrorClass::Retryable);
    }
}
