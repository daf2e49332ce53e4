//! Call identities: [`CallId`] names one logical call across all its attempts, [`TraceId`] groups the
//! calls of one business chain.
//!
//! A callId reads `prefix-unixms-entropy-node`, for example `ord-1710000000000-9f3c2a7d41b0e855-node07`:
//! what kind of call, roughly when, a 64-bit entropy field, and which node made it.
//!
//! # Guarantees
//!
//! * **Unique within a process by construction.** The entropy field is a keyed bijection of a process-wide
//!   counter, so two callIds made by one process never share it (until 2⁶⁴ generations).
//! * **At least 64 random bits across processes.** The bijection's key and the counter's start are drawn
//!   from the operating system's random source when the process first makes an id, so the entropy fields
//!   of two processes are independent 64-bit values.
//! * **Stable text form.** [`Display`](fmt::Display) and [`FromStr`] round-trip exactly; serde uses the same
//!   text.
//!
//! The id and its text form are here; [`ShortLabel`] (its prefix and node, and a key's scope), the rules for
//! their text and [`ParseCallIdError`] (`validate.rs`), [`TraceId`] (`trace.rs`), the W3C
//! [`TraceParent`] that carries it beside OpenTelemetry (`traceparent.rs`) and the entropy source
//! (`entropy.rs`) each have a file.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::clock::unix_ms_now;

mod entropy;
mod label;
mod trace;
mod traceparent;
mod validate;

use entropy::entropy;
pub use label::ShortLabel;
pub use trace::TraceId;
pub use traceparent::{ParseTraceParentError, TraceParent};
use validate::Field;
pub(crate) use validate::MAX_NODE_LEN;
pub use validate::{validate_label, validate_node, ParseCallIdError};

/// The identity of one logical call: made once by the caller, before the first attempt, and carried
/// unchanged by every retry, every receipt query and every compensation round.
///
/// ```
/// use samekey_runtime::CallId;
/// let id = CallId::new("ord", "node07").unwrap();
/// let text = id.to_string();
/// assert!(text.starts_with("ord-") && text.ends_with("-node07"));
/// assert_eq!(text.parse::<CallId>().unwrap(), id);
/// // A `&CallId` reads as its text wherever a `&str` is expected.
/// fn header(value: &str) -> usize { value.len() }
/// assert_eq!(header(&id), text.len());
/// ```
pub struct CallId {
    entropy: u64,
    unix_ms: u64,
    prefix: ShortLabel,
    node: ShortLabel,
    /// The text form, made on first use (most callIds are only ever written by `Display`).
    text: OnceLock<Arc<str>>,
}

impl Clone for CallId {
    /// Clones the fields; the copy makes its text form again if it is asked for it (cloning is on every
    /// call's path, reading the text is not).
    fn clone(&self) -> CallId {
        CallId {
            entropy: self.entropy,
            unix_ms: self.unix_ms,
            prefix: self.prefix.clone(),
            node: self.node.clone(),
            text: OnceLock::new(),
        }
    }
}

impl PartialEq for CallId {
    fn eq(&self, other: &CallId) -> bool {
        self.entropy == other.entropy
            && self.unix_ms == other.unix_ms
            && self.prefix == other.prefix
            && self.node == other.node
    }
}
impl Eq for CallId {}

impl std::ops::Deref for CallId {
    type Target = str;

    /// The text form, `prefix-unixms-entropy-node`: a `&CallId` passes where a `&str` is expected
    /// (a gateway's `status(&str)`, a header value).
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for CallId {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl CallId {
    /// Makes a new callId with the given prefix and node name, stamped with the current wall-clock time.
    pub fn new(prefix: &str, node: &str) -> Result<CallId, ParseCallIdError> {
        validate_label(prefix)?;
        validate_node(node)?;
        Ok(CallId::generate(
            ShortLabel::from(prefix),
            ShortLabel::from(node),
        ))
    }

    /// Makes a new callId from labels that are already validated.
    pub(crate) fn generate(prefix: ShortLabel, node: ShortLabel) -> CallId {
        CallId::generate_at(prefix, node, unix_ms_now())
    }

    /// Makes a new callId stamped `unix_ms`, from labels that are already validated.
    pub(crate) fn generate_at(prefix: ShortLabel, node: ShortLabel, unix_ms: u64) -> CallId {
        CallId {
            entropy: entropy().next(),
            unix_ms,
            prefix,
            node,
            text: OnceLock::new(),
        }
    }

    /// The prefix: what kind of call this is (`ord`, `pay`, …).
    pub fn prefix(&self) -> &str {
        self.prefix.as_str()
    }

    /// Milliseconds since the Unix epoch when the call was made.
    pub fn unix_ms(&self) -> u64 {
        self.unix_ms
    }

    /// The 64-bit entropy field.
    pub fn entropy(&self) -> u64 {
        self.entropy
    }

    /// The node that made the call.
    pub fn node(&self) -> &str {
        self.node.as_str()
    }

    /// The text form, `prefix-unixms-entropy-node` (the same as `Display`).
    pub fn as_str(&self) -> &str {
        self.text.get_or_init(|| Arc::from(self.to_string()))
    }
}

impl Hash for CallId {
    /// Hashes the entropy field only: it tells callIds apart on its own, and equal callIds share it.
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.entropy);
    }
}

impl fmt::Display for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{}-{:016x}-{}",
            self.prefix.as_str(),
            self.unix_ms,
            self.entropy,
            self.node.as_str()
        )
    }
}

impl fmt::Debug for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CallId({self})")
    }
}

impl FromStr for CallId {
    type Err = ParseCallIdError;

    fn from_str(s: &str) -> Result<CallId, ParseCallIdError> {
        // The node is the last field and may hold `-` itself (`api-7`).
        let mut fields = s.splitn(4, '-');
        let (Some(prefix), Some(ms), Some(entropy), Some(node)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(ParseCallIdError::new(
                Field::CallId,
                s,
                "expected four fields `prefix-unixms-entropy-node`",
            ));
        };
        validate_label(prefix).map_err(|e| e.within(s))?;
        validate_node(node).map_err(|e| e.within(s))?;
        if ms.is_empty() || !ms.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ParseCallIdError::new(
                Field::CallId,
                s,
                "the time field must be decimal milliseconds",
            ));
        }
        let unix_ms = ms.parse::<u64>().map_err(|_| {
            ParseCallIdError::new(Field::CallId, s, "the time field is out of range")
        })?;
        if entropy.len() != 16 || !entropy.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ParseCallIdError::new(
                Field::CallId,
                s,
                "the entropy field must be 16 hexadecimal digits",
            ));
        }
        let entropy = u64::from_str_radix(entropy, 16).map_err(|_| {
            ParseCallIdError::new(Field::CallId, s, "the entropy field is not hexadecimal")
        })?;
        Ok(CallId {
            entropy,
            unix_ms,
            prefix: ShortLabel::from(prefix),
            node: ShortLabel::from(node),
            // Not `s`: a parsed text may spell the fields otherwise (upper-case hex, leading zeros);
            // the text form is always the canonical one, made on first use.
            text: OnceLock::new(),
        })
    }
}

impl Serialize for CallId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CallId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<CallId, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_round_trips() {
        let id = CallId::new("ord", "node07").unwrap();
        let text = id.to_string();
        let fields: Vec<&str> = text.splitn(4, '-').collect();
        assert_eq!(fields.len(), 4);
        assert_eq!(fields[0], "ord");
        assert_eq!(fields[2].len(), 16);
        assert_eq!(fields[3], "node07");
        assert_eq!(text.parse::<CallId>().unwrap(), id);
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, format!("\"{text}\""));
        assert_eq!(serde_json::from_str::<CallId>(&json).unwrap(), id);
    }

    #[test]
    fn bad_text_is_a_typed_error() {
        for bad in [
            "",
            "ord",
            "ord-1-00000000000000ff",
            "ord-x-00000000000000ff-n",
            "ord-1-ff-n",
            "ord-1-00000000000000fg-n",
            "ord-1-00000000000000ff-n_!",
            "ord-1-00000000000000ff-",
            "o rd-1-00000000000000ff-n",
            "ord-99999999999999999999999-00000000000000ff-n",
        ] {
            assert!(bad.parse::<CallId>().is_err(), "{bad:?} parsed");
        }
        assert!(CallId::new("has-dash", "n").is_err());
        assert!(CallId::new("p", "").is_err());
    }

    #[test]
    fn host_style_node_names_are_accepted() {
        let spelled = "ord-0017-00000000000000FF-api-7".parse::<CallId>().unwrap();
        assert_eq!(
            spelled.as_str(),
            "ord-17-00000000000000ff-api-7",
            "the canonical text"
        );
        assert_eq!(&*spelled, spelled.to_string());
        for node in [
            "api-7",
            "orders-api-5d9f8b6c5-x2x9k",
            "web.eu-west-1",
            "n",
            &"a".repeat(63),
        ] {
            let id = CallId::new("ord", node).unwrap();
            assert_eq!(id.node(), node);
            let back: CallId = id.to_string().parse().unwrap();
            assert_eq!(back, id);
            assert_eq!(back.node(), node);
        }
        let too_long = "a".repeat(64);
        for bad in ["api 7", "", "ünï", too_long.as_str()] {
            let e = CallId::new("ord", bad).unwrap_err();
            assert!(e.to_string().starts_with("invalid node name"), "{e}");
            assert_eq!(e.input(), bad);
        }
        let e = CallId::new("o-rd", "n").unwrap_err();
        assert!(
            e.to_string().starts_with("invalid callId prefix `o-rd`"),
            "{e}"
        );
    }
}
