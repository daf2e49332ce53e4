//! [`TraceParent`]: the W3C Trace Context `traceparent` value (version `00`), so that a call's traceId
//! travels as the trace-id OpenTelemetry and every W3C-speaking peer read.
//!
//! # Guarantees
//!
//! * **Parsing follows W3C Trace Context §3.2** (level 1, and level 2's `traceparent`): version `00` is
//!   exactly 55 characters, `00-<32 lowercase hex>-<16 lowercase hex>-<2 lowercase hex>`; a higher
//!   version (any but `ff`) is read from its first 55 characters when they are followed by `-` or the
//!   end; version `ff`, upper-case hex, an all-zero trace-id and an all-zero parent-id are refused, each
//!   by a [`ParseTraceParentError`] that says which.
//! * **Written as version `00`**, and [`Display`](fmt::Display) and [`FromStr`] round-trip exactly.
//! * **A value made here never has a zero parent-id**: [`TraceParent::new`] and [`TraceParent::child`]
//!   draw one from the same entropy source as callIds, never 0.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::entropy::entropy;
use super::TraceId;

/// The W3C Trace Context `traceparent` of a request: its trace-id (samekey's [`TraceId`]), the
/// parent-id (the span of the caller that sent it) and the trace flags (bit 0: sampled).
///
/// See <https://www.w3.org/TR/trace-context/#traceparent-header>. samekey adopts an inbound
/// `traceparent`'s trace-id as the call's traceId and passes the value on; an outbound request made
/// inside a call carries [`Context::traceparent`](crate::context::Context::traceparent).
///
/// ```
/// use samekey_runtime::{TraceId, TraceParent};
/// let tp: TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap();
/// assert_eq!(tp.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert_eq!(tp.parent_id(), 0x00f0_67aa_0ba9_02b7);
/// assert!(tp.sampled());
/// assert_eq!(tp.to_string(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
///
/// // A hop of its own: the same trace and flags, a new parent-id.
/// let next = tp.child();
/// assert_eq!((next.trace_id(), next.flags()), (tp.trace_id(), tp.flags()));
/// assert_ne!(next.parent_id(), tp.parent_id());
///
/// // Refused, with the reason.
/// let e = "00-00000000000000000000000000000000-00f067aa0ba902b7-01".parse::<TraceParent>().unwrap_err();
/// assert_eq!(e.to_string(), "invalid traceparent: the trace-id is all zeros");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    trace_id: TraceId,
    parent_id: u64,
    flags: u8,
}

/// The `sampled` bit of the trace flags.
const SAMPLED: u8 = 0x01;

/// The length of a version-`00` `traceparent`, and of the part of a higher version that is read.
const LEN: usize = 55;

impl TraceParent {
    /// A request's `traceparent` from the values its header (or gRPC metadata entry) holds, as a
    /// receiver reads it (W3C Trace Context §3.2): the one value that parses, else `None` — a
    /// malformed value, or several (a list is invalid), is ignored and logged at debug, and the trace
    /// restarts.
    pub fn from_header_values<'a>(
        values: impl IntoIterator<Item = &'a [u8]>,
    ) -> Option<TraceParent> {
        let mut values = values.into_iter();
        let value = values.next()?;
        let parsed = if values.next().is_some() {
            Err("more than one `traceparent` value".to_owned())
        } else {
            std::str::from_utf8(value)
                .map_err(|_| "it is not visible ASCII".to_owned())
                .and_then(|text| text.trim().parse().map_err(|e| format!("{e}")))
        };
        match parsed {
            Ok(tp) => Some(tp),
            Err(why) => {
                tracing::debug!(%why, "samekey: a malformed `traceparent` is ignored (the trace restarts)");
                None
            }
        }
    }

    /// A `traceparent` for `trace_id` with `parent_id` and `flags`; a `parent_id` of 0 (which W3C
    /// forbids) is replaced by a random non-zero one.
    ///
    /// The trace-id is kept as it is: a traceId of all zeros (which an `X-Trace-Id` may carry, but
    /// W3C forbids) gives a value that a W3C peer refuses, and so restarts the trace.
    ///
    /// ```
    /// use samekey_runtime::{TraceId, TraceParent};
    /// let trace = TraceId::from_u128(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736);
    /// let tp = TraceParent::new(trace, 0, 0x01);
    /// assert_eq!(tp.trace_id(), trace);
    /// assert_ne!(tp.parent_id(), 0);
    /// assert!(tp.sampled());
    /// ```
    pub fn new(trace_id: TraceId, parent_id: u64, flags: u8) -> TraceParent {
        TraceParent {
            trace_id,
            parent_id: if parent_id == 0 {
                random_parent_id()
            } else {
                parent_id
            },
            flags,
        }
    }

    /// The same trace and flags with a new random non-zero parent-id: what a hop that records a span
    /// of its own sends on.
    pub fn child(self) -> TraceParent {
        let mut parent_id = random_parent_id();
        while parent_id == self.parent_id {
            parent_id = random_parent_id();
        }
        TraceParent { parent_id, ..self }
    }

    /// The trace-id: samekey's traceId.
    pub fn trace_id(&self) -> TraceId {
        self.trace_id
    }

    /// The parent-id (W3C's name for the id of the sender's span), never 0 in a parsed value.
    pub fn parent_id(&self) -> u64 {
        self.parent_id
    }

    /// The trace flags (bit 0: sampled; level 2's bit 1: random trace-id).
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// Whether the `sampled` flag is set: the caller may have recorded trace data.
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }
}

/// A random non-zero 64-bit id from the callIds' entropy source (unique within the process).
fn random_parent_id() -> u64 {
    let source = entropy();
    loop {
        // The source's bijection maps exactly one counter value to 0: the next one is not.
        let id = source.next();
        if id != 0 {
            return id;
        }
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{:016x}-{:02x}",
            self.trace_id, self.parent_id, self.flags
        )
    }
}

impl fmt::Debug for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceParent({self})")
    }
}

/// Why a `traceparent` was refused ([`TraceParent`]'s [`FromStr`]). Per W3C Trace Context §3.2 a
/// receiver that cannot parse it restarts the trace: samekey's HTTP layer ignores such a header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseTraceParentError {
    /// A version-`00` value is not exactly 55 characters, or a higher version's is shorter.
    #[error("invalid traceparent: version {version} must be {expected} characters, not {len}")]
    Length {
        /// The version, as written.
        version: String,
        /// What that version needs: `exactly 55` or `at least 55`.
        expected: &'static str,
        /// The length found.
        len: usize,
    },
    /// The version is not two lowercase hexadecimal digits.
    #[error("invalid traceparent: the version must be two lowercase hexadecimal digits")]
    Version,
    /// Version `ff`, which W3C forbids.
    #[error("invalid traceparent: version ff is forbidden")]
    ForbiddenVersion,
    /// The fields are not separated by `-` where they must be, or a higher version's 55 characters
    /// are followed by something else than `-`.
    #[error("invalid traceparent: expected `-` at character {at}")]
    Separator {
        /// The 0-based position where `-` was expected.
        at: usize,
    },
    /// A field is not lowercase hexadecimal.
    #[error("invalid traceparent: the {field} must be {digits} lowercase hexadecimal digits")]
    Field {
        /// `trace-id`, `parent-id` or `trace-flags`.
        field: &'static str,
        /// How many digits it has.
        digits: usize,
    },
    /// The trace-id is all zeros.
    #[error("invalid traceparent: the trace-id is all zeros")]
    ZeroTraceId,
    /// The parent-id is all zeros.
    #[error("invalid traceparent: the parent-id is all zeros")]
    ZeroParentId,
}

/// `bytes` as a number if they are all lowercase hexadecimal digits.
fn lower_hex(bytes: &[u8]) -> Option<u128> {
    bytes.iter().try_fold(0u128, |n, &b| {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        Some((n << 4) | u128::from(digit))
    })
}

impl FromStr for TraceParent {
    type Err = ParseTraceParentError;

    /// Parses a `traceparent` by W3C Trace Context §3.2 (see [`TraceParent`]). Surrounding
    /// whitespace (optional whitespace around a header value) is not part of it: trim it first.
    fn from_str(s: &str) -> Result<TraceParent, ParseTraceParentError> {
        use ParseTraceParentError as E;
        let b = s.as_bytes();
        let version = b.get(..2).and_then(lower_hex).ok_or(E::Version)?;
        if version == 0xff {
            return Err(E::ForbiddenVersion);
        }
        let version_text = || s.get(..2).unwrap_or_default().to_owned();
        if version == 0 && b.len() != LEN {
            return Err(E::Length {
                version: version_text(),
                expected: "exactly 55",
                len: b.len(),
            });
        }
        if b.len() < LEN {
            return Err(E::Length {
                version: version_text(),
                expected: "at least 55",
                len: b.len(),
            });
        }
        // A higher version may add fields after the first four, each after a `-`.
        if b.len() > LEN && b[LEN] != b'-' {
            return Err(E::Separator { at: LEN });
        }
        for at in [2, 35, 52] {
            if b[at] != b'-' {
                return Err(E::Separator { at });
            }
        }
        let field = |range: std::ops::Range<usize>, field: &'static str| {
            let digits = range.len();
            lower_hex(&b[range]).ok_or(E::Field { field, digits })
        };
        let trace_id = field(3..35, "trace-id")?;
        let parent_id = field(36..52, "parent-id")?;
        let flags = field(53..55, "trace-flags")?;
        if trace_id == 0 {
            return Err(E::ZeroTraceId);
        }
        if parent_id == 0 {
            return Err(E::ZeroParentId);
        }
        // Of a higher version, only the sampled flag is known to mean what it means in `00`.
        let flags = if version == 0 {
            flags as u8
        } else {
            flags as u8 & SAMPLED
        };
        Ok(TraceParent {
            trace_id: TraceId::from_u128(trace_id),
            parent_id: parent_id as u64,
            flags,
        })
    }
}

impl Serialize for TraceParent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TraceParent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<TraceParent, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_w3c_example_parses() {
        let tp: TraceParent = EXAMPLE.parse().unwrap();
        assert_eq!(
            tp.trace_id().as_u128(),
            0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736
        );
        assert_eq!(tp.parent_id(), 0x00f0_67aa_0ba9_02b7);
        assert_eq!(tp.flags(), 1);
        assert!(tp.sampled());
        assert_eq!(tp.to_string(), EXAMPLE);
        let unsampled: TraceParent = EXAMPLE.replace("-01", "-00").parse().unwrap();
        assert!(!unsampled.sampled());
    }

    #[test]
    fn higher_versions_are_read_by_their_first_55_characters() {
        let v1 = EXAMPLE.replacen("00", "01", 1);
        let tp: TraceParent = v1.parse().unwrap();
        assert_eq!(tp.to_string(), EXAMPLE, "written as version 00");
        let more: TraceParent = format!("{v1}-what-comes-next").parse().unwrap();
        assert_eq!(more, tp);
        // Unknown flags of a higher version are not carried over.
        let flags: TraceParent = v1.replace("-01", "-ff").parse().unwrap();
        assert_eq!(flags.flags(), 0x01);
        assert_eq!(
            format!("{v1}x").parse::<TraceParent>(),
            Err(ParseTraceParentError::Separator { at: 55 })
        );
    }

    #[test]
    fn refusals_say_what_is_wrong() {
        use ParseTraceParentError as E;
        let cases: [(String, ParseTraceParentError); 11] = [
            (EXAMPLE.replacen("00", "ff", 1), E::ForbiddenVersion),
            (EXAMPLE.replacen("00", "0A", 1), E::Version),
            (String::new(), E::Version),
            (
                format!("{EXAMPLE}-"),
                E::Length {
                    version: "00".into(),
                    expected: "exactly 55",
                    len: 56,
                },
            ),
            (
                EXAMPLE.replacen("00", "01", 1)[..54].to_owned(),
                E::Length {
                    version: "01".into(),
                    expected: "at least 55",
                    len: 54,
                },
            ),
            (
                EXAMPLE.replace("4bf9", "4BF9"),
                E::Field {
                    field: "trace-id",
                    digits: 32,
                },
            ),
            (
                EXAMPLE.replace("00f0", "00F0"),
                E::Field {
                    field: "parent-id",
                    digits: 16,
                },
            ),
            (
                EXAMPLE.replace("-01", "-0g"),
                E::Field {
                    field: "trace-flags",
                    digits: 2,
                },
            ),
            (
                format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32)),
                E::ZeroTraceId,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01".into(),
                E::ZeroParentId,
            ),
            (EXAMPLE.replacen('-', "_", 1), E::Separator { at: 2 }),
        ];
        for (text, expected) in cases {
            assert_eq!(text.parse::<TraceParent>(), Err(expected), "{text:?}");
        }
        assert_eq!(
            E::Field {
                field: "trace-id",
                digits: 32
            }
            .to_string(),
            "invalid traceparent: the trace-id must be 32 lowercase hexadecimal digits"
        );
    }

    #[test]
    fn made_values_have_a_non_zero_parent() {
        let trace = TraceId::new();
        let tp = TraceParent::new(trace, 0, 0);
        assert_ne!(tp.parent_id(), 0);
        assert_eq!(TraceParent::new(trace, 7, 1).parent_id(), 7);
        let child = tp.child();
        assert_ne!(child.parent_id(), 0);
        assert_ne!(child.parent_id(), tp.parent_id());
        assert_eq!(
            serde_json::to_string(&tp).unwrap(),
            format!("\"{tp}\""),
            "serde uses the text form"
        );
    }

    proptest! {
        #[test]
        fn display_and_from_str_round_trip(
            trace in 1u128..,
            parent in 1u64..,
            flags in any::<u8>(),
        ) {
            let tp = TraceParent::new(TraceId::from_u128(trace), parent, flags);
            let text = tp.to_string();
            prop_assert_eq!(text.len(), 55);
            prop_assert_eq!(text.parse::<TraceParent>(), Ok(tp));
            prop_assert_eq!(text.parse::<TraceParent>().unwrap().to_string(), text);
        }
    }
}
