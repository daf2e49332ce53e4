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

use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::clock::unix_ms_now;

/// Longest accepted callId prefix, in bytes.
pub const MAX_LABEL_LEN: usize = 32;
/// Longest accepted node name, in bytes: a DNS label's length, so that a host or pod name fits.
pub const MAX_NODE_LEN: usize = 63;

/// A short text label (callId prefix, node name, key scope) that is cheap to clone.
#[derive(Clone)]
pub struct Label(LabelRepr);

#[derive(Clone)]
enum LabelRepr {
    Static(&'static str),
    Shared(Arc<str>),
}

impl Label {
    /// A label borrowed for the whole program, as the macro's constants are. No allocation.
    pub const fn from_static(s: &'static str) -> Label {
        Label(LabelRepr::Static(s))
    }

    /// The label's text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            LabelRepr::Static(s) => s,
            LabelRepr::Shared(s) => s,
        }
    }
}

impl From<&str> for Label {
    fn from(s: &str) -> Label {
        Label(LabelRepr::Shared(Arc::from(s)))
    }
}

impl From<String> for Label {
    fn from(s: String) -> Label {
        Label(LabelRepr::Shared(Arc::from(s)))
    }
}

impl PartialEq for Label {
    fn eq(&self, other: &Label) -> bool {
        self.as_str() == other.as_str()
    }
}
impl Eq for Label {}
impl Hash for Label {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}
impl fmt::Debug for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}
impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Checks that `s` can be a callId prefix: 1 to 32 bytes of ASCII letters, digits, `_`
/// or `.` (no `-`, which ends the prefix).
pub fn validate_label(s: &str) -> Result<(), ParseCallIdError> {
    validate(
        Field::Prefix,
        s,
        MAX_LABEL_LEN,
        b"_.",
        [
            "a callId prefix must be 1 to 32 characters long",
            "a callId prefix may only hold ASCII letters, digits, `_` and `.`",
        ],
    )
}

/// Checks that `s` can be a node name, the callId's last field: 1 to 63 bytes of ASCII
/// letters, digits, `_`, `.` or `-`, so that host and pod names (`api-7`, `orders-5d9f-x2x9k`,
/// `web.eu-1`) are node names as they are.
pub fn validate_node(s: &str) -> Result<(), ParseCallIdError> {
    validate(
        Field::Node,
        s,
        MAX_NODE_LEN,
        b"_.-",
        [
            "a node name must be 1 to 63 characters long",
            "a node name may only hold ASCII letters, digits, `_`, `.` and `-`",
        ],
    )
}

/// `s` is 1 to `max` bytes of ASCII letters, digits and `extra`; else the first or the second reason.
fn validate(
    field: Field,
    s: &str,
    max: usize,
    extra: &[u8],
    [length, chars]: [&'static str; 2],
) -> Result<(), ParseCallIdError> {
    if s.is_empty() || s.len() > max {
        return Err(ParseCallIdError::new(field, s, length));
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
    {
        return Err(ParseCallIdError::new(field, s, chars));
    }
    Ok(())
}

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
    prefix: Label,
    node: Label,
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
        Ok(CallId::generate(Label::from(prefix), Label::from(node)))
    }

    /// Makes a new callId from labels that are already validated.
    pub(crate) fn generate(prefix: Label, node: Label) -> CallId {
        CallId::generate_at(prefix, node, unix_ms_now())
    }

    /// Makes a new callId stamped `unix_ms`, from labels that are already validated.
    pub(crate) fn generate_at(prefix: Label, node: Label, unix_ms: u64) -> CallId {
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
            prefix: Label::from(prefix),
            node: Label::from(node),
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

/// Why a text is not a valid [`CallId`], callId prefix or node name. Its message names which one, the
/// text, and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field} `{input}`: {reason}")]
pub struct ParseCallIdError {
    field: Field,
    input: String,
    reason: &'static str,
}

/// What [`ParseCallIdError`] was parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    CallId,
    Prefix,
    Node,
    TraceId,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::CallId => "callId",
            Field::Prefix => "callId prefix",
            Field::Node => "node name (`Runtime::builder().node(...)`)",
            Field::TraceId => "traceId",
        })
    }
}

impl ParseCallIdError {
    fn new(field: Field, input: &str, reason: &'static str) -> ParseCallIdError {
        ParseCallIdError {
            field,
            input: input.to_owned(),
            reason,
        }
    }

    /// A field's error, reported for the whole callId it is part of.
    fn within(mut self, whole: &str) -> ParseCallIdError {
        self.field = Field::CallId;
        self.input = whole.to_owned();
        self
    }

    /// The text that was refused.
    pub fn input(&self) -> &str {
        &self.input
    }

    /// What is wrong with it.
    pub fn reason(&self) -> &str {
        self.reason
    }
}

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

    /// The traceId as a number.
    pub fn as_u128(self) -> u128 {
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

/// The process-wide source of entropy fields: a counter fed through a keyed 64-bit bijection.
pub(crate) struct Entropy {
    counter: AtomicU64,
    k0: u64,
    k1: u64,
    k2: u64,
    trace_key: u64,
}

impl Entropy {
    fn seeded(seed: [u64; 5]) -> Entropy {
        Entropy {
            counter: AtomicU64::new(seed[0]),
            k0: seed[1],
            // Multipliers must be odd to be invertible modulo 2^64.
            k1: seed[2] | 1,
            k2: seed[3],
            trace_key: seed[4],
        }
    }

    /// The next value: distinct from every earlier one of this process (the counter is unique and
    /// [`Entropy::mix`] is a bijection).
    pub(crate) fn next(&self) -> u64 {
        self.mix(self.counter.fetch_add(1, Ordering::Relaxed))
    }

    /// A keyed bijection of `u64`: additions, odd multiplications and xor-shifts are each invertible.
    fn mix(&self, x: u64) -> u64 {
        let mut z = x.wrapping_add(self.k0);
        z ^= z >> 31;
        z = z.wrapping_mul(self.k1);
        z ^= z >> 29;
        z = z.wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 32;
        z ^ self.k2
    }
}

pub(crate) fn entropy() -> &'static Entropy {
    static ENTROPY: OnceLock<Entropy> = OnceLock::new();
    ENTROPY.get_or_init(|| Entropy::seeded(random_seed()))
}

/// Five random words from the operating system; if it has none to give, a hash of time, process id and
/// stack address (still different per process, though no longer secret).
fn random_seed() -> [u64; 5] {
    let mut bytes = [0u8; 40];
    if getrandom::fill(&mut bytes).is_err() {
        use std::collections::hash_map::RandomState;
        use std::hash::BuildHasher;
        let state = RandomState::new();
        let marker = 0u8;
        for (i, chunk) in bytes.chunks_mut(8).enumerate() {
            let word = state.hash_one((
                i,
                unix_ms_now(),
                std::process::id(),
                &marker as *const u8 as usize,
            ));
            chunk.copy_from_slice(&word.to_le_bytes());
        }
    }
    let mut seed = [0u64; 5];
    for (word, chunk) in seed.iter_mut().zip(bytes.chunks(8)) {
        let mut buf = [0u8; 8];
        buf.copy_from_slice(chunk);
        *word = u64::from_le_bytes(buf);
    }
    seed
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

    #[test]
    fn mix_is_a_bijection_on_a_sample() {
        let source = Entropy::seeded([0, 7, 11, 13, 17]);
        let mut seen = std::collections::HashSet::new();
        for x in 0..100_000u64 {
            assert!(seen.insert(source.mix(x)));
        }
    }

    #[test]
    fn trace_ids_round_trip() {
        let t = TraceId::new();
        assert_eq!(t.to_string().parse::<TraceId>().unwrap(), t);
        assert_ne!(TraceId::new(), t);
    }
}
