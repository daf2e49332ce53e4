//! [`TraceId`]: groups the callIds of one business chain; 128 bits from the same entropy source as
//! callIds, shown as 32 hex digits.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::entropy::entropy;
use super::validate::{Field, ParseCallIdError};

/// Groups the callIds of one business chain (check → debit → notify). 128 bits, shown as 32 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(u128);

impl TraceId {
    /// A new traceId, unique within the process by construction and random across processes.
    pub fn new() -> TraceId {
        let source = entropy();
        let low = source.next();
        let high = source.mix(low ^ source.trace_key);
        TraceId((u128::from(high) << 64) | u128::from(low))
    }

    /// The traceId whose number is `v` (as `From<u128>`, in a `const`).
    pub const fn from_u128(v: u128) -> TraceId {
        TraceId(v)
    }

    /// The traceId as a number.
    pub const fn as_u128(self) -> u128 {
        self.0
    }
}

impl Default for TraceId {
    fn default() -> TraceId {
        TraceId::new()
    }
}

impl From<u128> for TraceId {
    fn from(v: u128) -> TraceId {
        TraceId(v)
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceId({self})")
    }
}

impl FromStr for TraceId {
    type Err = ParseCallIdError;

    fn from_str(s: &str) -> Result<TraceId, ParseCallIdError> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ParseCallIdError::new(
                Field::TraceId,
                s,
                "a traceId is 32 hexadecimal digits",
            ));
        }
        u128::from_str_radix(s, 16).map(TraceId).map_err(|_| {
            ParseCallIdError::new(Field::TraceId, s, "a traceId is 32 hexadecimal digits")
        })
    }
}

impl Serialize for TraceId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TraceId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<TraceId, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_ids_round_trip() {
        let t = TraceId::new();
        assert_eq!(t.to_string().parse::<TraceId>().unwrap(), t);
        assert_ne!(TraceId::new(), t);
    }
}
