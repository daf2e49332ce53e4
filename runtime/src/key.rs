//! Idempotency keys: the stable, unambiguous byte encoding of key parts ([`KeyPart`]) and the key itself
//! ([`Key`]), a SHA-256 digest of that encoding.
//!
//! # Encoding (version 1)
//!
//! Every value writes a one-byte tag followed by its content; lengths and counts are unsigned LEB128
//! varints, so the encoding is self-delimiting: `("ab", "c")` and `("a", "bc")` can never collide.
//!
//! | tag  | value                         | content                                           |
//! |------|-------------------------------|---------------------------------------------------|
//! | 0x00 | `()`                          | —                                                 |
//! | 0x01 | unsigned integers (any width) | LEB128 of the value                               |
//! | 0x02 | signed integers (any width)   | LEB128 of the zig-zag value                       |
//! | 0x03 | `bool`                        | one byte, 0 or 1                                  |
//! | 0x04 | `char`                        | LEB128 of the scalar value                        |
//! | 0x05 | strings                       | byte length, UTF-8 bytes                          |
//! | 0x06 | raw bytes ([`KeyBytes`])      | byte length, bytes                                |
//! | 0x07 | sequences (`Vec`, slices, …)  | element count, elements                           |
//! | 0x08 | `None`                        | —                                                 |
//! | 0x09 | `Some(v)`                     | `v`                                               |
//! | 0x0a | tuples                        | arity, elements                                   |
//! | 0x0b | maps (`BTreeMap`)             | entry count, then key and value of each, in order |
//! | 0x0c | derived structs               | field count, fields in declaration order          |
//! | 0x0d | derived enum variants         | variant name (as a string body), field count, fields |
//! | 0x10 | `uuid::Uuid` (feature `uuid`) | 16 bytes                                          |
//! | 0x11 | `chrono::NaiveDate` (`chrono`)| LEB128 of zig-zag days since 0001-01-01           |
//! | 0x12 | `serde_json::Value` (`json`)  | one byte for the kind, then: null —; bool; integer as 0x01/0x02 above; string; array as a sequence; object as a map with its keys sorted |
//! | 0x1f | time window                   | window length in ms, bucket number                |
//!
//! Integer widths are not part of the encoding: widening a parameter from `u32` to `u64` keeps its keys.
//! A key is `SHA-256("samekey/key/v1" ‖ scope as a string ‖ parts…)`; the scope is the function's stable
//! name space. Nothing here depends on `Debug`, `Hash`, pointer values, the platform or the process, and
//! the tests pin exact bytes so that a change of encoding cannot slip through.
//!
//! # Missing parts
//!
//! A top-level key part that is absent ([`KeyPart::is_missing`]: `None`) makes the call fail with
//! `Error::MissingKey` before anything runs, unless the function opts in with
//! `on_missing_key = "run"`: every call without it would otherwise share the key of `None`. An
//! `Option` inside a part (a field of a derived struct, an element of a tuple) is encoded as above.
//!
//! # Where the code is
//!
//! * this file: the [`KeyPart`] trait (what may be a key part), the [`Key`] (what is stored) and
//!   the [`KeyBuilder`] the generated code makes a key with;
//! * `key/encode.rs`: the tags of the table above, the [`KeyEncoder`] that writes them,
//!   [`KeyBytes`] and [`key_bytes`];
//! * `key/parts.rs`: the `KeyPart` impls of the standard types, and of `uuid`, `chrono` and
//!   `serde_json` behind their features;
//! * `key/digest.rs`: the [`Fingerprint`] of the `verify` parts, [`ShortKey`], the hex form of
//!   digests.
//!
//! The module is `key.rs` beside `key/`, not `key/mod.rs`, and `KeyBuilder` is here, not in
//! `encode.rs`: the compile errors users read name the file of `KeyBuilder::named_part`'s bound
//! (`runtime/src/key.rs`, pinned in `tests/ui/fail/*.stderr`).

use std::fmt;

use crate::call_id::ShortLabel;

mod digest;
mod encode;
mod parts;

#[cfg(feature = "redis")]
pub(crate) use digest::digest_from_hex;
pub(crate) use digest::hex;
pub use digest::{Fingerprint, ShortKey};
pub use encode::{key_bytes, KeyBytes, KeyEncoder};

/// A value that may be part of an idempotency key: it has a stable, unambiguous byte encoding.
///
/// Implemented for integers, `bool`, `char`, strings, `Option`, tuples, sequences and ordered collections
/// of key parts, and through `#[derive(KeyPart)]` for your own structs and enums. It is deliberately
/// **not** implemented for floats, `HashMap`/`HashSet`, `Instant` or `SystemTime`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be part of an idempotency key",
    label = "`{Self}` has no stable key encoding (it does not implement `samekey::KeyPart`)",
    note = "a key must be the same for every attempt, process and release: floats (rounding, NaN, -0.0), `HashMap`/`HashSet` (iteration order differs per process) and clocks (`Instant`, `SystemTime`) are rejected on purpose",
    note = "use integers (amounts in minor units such as cents), strings, `BTreeMap`/`BTreeSet`, `window = \"1d\"` for time buckets, or `#[derive(samekey::KeyPart)]` on your own types",
    note = "`uuid::Uuid` is a key part with samekey's `uuid` feature, `chrono::NaiveDate` with `chrono`, `serde_json::Value` with `json`: `samekey = {{ version = \"0.1\", features = [\"uuid\"] }}`; a `DateTime` is an instant, not a business value: key by the business date (`NaiveDate`) or an id"
)]
pub trait KeyPart {
    /// Writes this value's encoding. Implementations call the [`KeyEncoder`] methods that match their
    /// shape; the order of calls is part of the key, so keep it stable.
    fn encode_key(&self, out: &mut KeyEncoder);

    /// Whether this value, as a whole key part, is absent (`None`), so that the key would not name
    /// the operation. Only top-level parts are asked; an `Option` inside a part is encoded.
    fn is_missing(&self) -> bool {
        false
    }
}

/// An idempotency key: the SHA-256 digest of the scope and the key parts, so personal data in key parts
/// is never stored in clear. Keeps its scope for people reading receipts.
#[derive(Clone)]
pub struct Key {
    digest: [u8; 32],
    scope: ShortLabel,
}

impl Key {
    /// The key of a function in `scope` whose key is the single part `part`. A key of several parts
    /// (`key = "order_id + op"`) is rebuilt part by part with [`KeyBuilder`], as the macro does: a tuple
    /// is one part, with a header of its own, so `Key::build(scope, &(order_id, op))` differs.
    pub fn build<P: KeyPart + ?Sized>(scope: &str, part: &P) -> Key {
        let mut builder = KeyBuilder::new(scope);
        part.encode_key(&mut builder.encoder);
        builder.finish()
    }

    /// A key rebuilt from a stored digest.
    pub fn from_digest(scope: impl Into<ShortLabel>, digest: [u8; 32]) -> Key {
        Key {
            digest,
            scope: scope.into(),
        }
    }

    /// The SHA-256 digest.
    pub fn digest(&self) -> &[u8; 32] {
        &self.digest
    }

    /// The scope the key was made in.
    pub fn scope(&self) -> &str {
        self.scope.as_str()
    }

    /// The digest as 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex(&self.digest)
    }

    /// The first 16 hex digits: enough to tell keys apart in logs.
    pub fn short(&self) -> ShortKey<'_> {
        ShortKey(self)
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.digest == other.digest
    }
}
impl Eq for Key {}
impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.digest.hash(state)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.scope, hex(&self.digest))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({self})")
    }
}

/// Builds a key from a scope and parts, hashing as it goes. Used by the generated code.
pub struct KeyBuilder {
    encoder: KeyEncoder,
    scope: ShortLabel,
    problem: Option<KeyProblem>,
}

/// Why a key cannot name its operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyProblem {
    /// This top-level part is `None`.
    Missing(&'static str),
    /// This part has no stable encoding, for this reason.
    Refused(&'static str, &'static str),
}

impl KeyBuilder {
    /// Starts a key in `scope`.
    pub fn new(scope: &str) -> KeyBuilder {
        KeyBuilder::with_label(ShortLabel::from(scope))
    }

    /// Starts a key in a scope known for the whole program (no allocation).
    #[inline]
    pub fn new_static(scope: &'static str) -> KeyBuilder {
        KeyBuilder::with_label(ShortLabel::from_static(scope))
    }

    #[inline]
    fn with_label(scope: ShortLabel) -> KeyBuilder {
        let mut encoder = KeyEncoder::hashing();
        encoder.str(scope.as_str());
        KeyBuilder {
            encoder,
            scope,
            problem: None,
        }
    }

    /// Appends one part.
    pub fn part<P: KeyPart + ?Sized>(&mut self, part: &P) {
        part.encode_key(&mut self.encoder);
        if let Some(reason) = self.encoder.refused.take() {
            self.problem.get_or_insert(KeyProblem::Refused("", reason));
        }
    }

    /// Appends one top-level part named `name` (as written in `key = "..."`), noting whether it is
    /// missing or refused its encoding. Used by the generated code.
    #[doc(hidden)]
    pub fn named_part<P: KeyPart + ?Sized>(&mut self, part: &P, name: &'static str) {
        if self.problem.is_none() && part.is_missing() {
            self.problem = Some(KeyProblem::Missing(name));
        }
        part.encode_key(&mut self.encoder);
        if let Some(reason) = self.encoder.refused.take() {
            if !matches!(self.problem, Some(KeyProblem::Refused(..))) {
                self.problem = Some(KeyProblem::Refused(name, reason));
            }
        }
    }

    /// Appends one `verify` part named `name`, noting whether it refused its encoding (a missing
    /// `verify` part is a value like any other). Used by the generated code.
    #[doc(hidden)]
    pub fn verify_part<P: KeyPart + ?Sized>(&mut self, part: &P, name: &'static str) {
        part.encode_key(&mut self.encoder);
        if let Some(reason) = self.encoder.refused.take() {
            self.problem
                .get_or_insert(KeyProblem::Refused(name, reason));
        }
    }

    /// What keeps this key from naming its operation, if anything.
    pub(crate) fn problem(&self) -> Option<&KeyProblem> {
        self.problem.as_ref()
    }

    /// Appends the time bucket `unix_ms / window_ms` (a window of 0 ms adds nothing).
    pub fn window(&mut self, window_ms: u64, unix_ms: u64) {
        if let Some(bucket) = unix_ms.checked_div(window_ms) {
            self.encoder.window(window_ms, bucket);
        }
    }

    /// The finished key.
    #[inline]
    pub fn finish(self) -> Key {
        Key {
            digest: self.encoder.finish(),
            scope: self.scope,
        }
    }

    /// The finished digest, as a verify fingerprint.
    pub fn fingerprint(self) -> Fingerprint {
        Fingerprint(self.encoder.finish())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use sha2::{Digest, Sha256};

    use super::*;

    #[test]
    fn pinned_part_bytes() {
        assert_eq!(key_bytes(&0u8), [0x01, 0x00]);
        assert_eq!(key_bytes(&300u64), [0x01, 0xac, 0x02]);
        assert_eq!(key_bytes(&300u16), key_bytes(&300u128));
        assert_eq!(key_bytes(&-1i32), [0x02, 0x01]);
        assert_eq!(key_bytes(&1i64), [0x02, 0x02]);
        assert_eq!(key_bytes(&true), [0x03, 0x01]);
        assert_eq!(key_bytes(&'é'), [0x04, 0xe9, 0x01]);
        assert_eq!(key_bytes("ab"), [0x05, 0x02, b'a', b'b']);
        assert_eq!(key_bytes(&String::from("ab")), key_bytes("ab"));
        assert_eq!(key_bytes(&KeyBytes(b"\x00\xff")), [0x06, 0x02, 0x00, 0xff]);
        assert_eq!(
            key_bytes(&vec![1u8, 2]),
            [0x07, 0x02, 0x01, 0x01, 0x01, 0x02]
        );
        assert_eq!(key_bytes(&None::<u8>), [0x08]);
        assert_eq!(key_bytes(&Some(5u8)), [0x09, 0x01, 0x05]);
        assert_eq!(key_bytes(&()), [0x00]);
        let map: BTreeMap<&str, u8> = [("b", 2), ("a", 1)].into_iter().collect();
        assert_eq!(
            key_bytes(&map),
            [0x0b, 0x02, 0x05, 0x01, b'a', 0x01, 0x01, 0x05, 0x01, b'b', 0x01, 0x02]
        );
    }

    #[test]
    fn pinned_key_digests() {
        // These digests are part of the stored data of every user: if this test fails, the encoding
        // changed and every existing key would stop matching. Bump the version tag instead. The value
        // was checked with an independent SHA-256 (Python hashlib) over the bytes the table documents:
        // "samekey/key/v1" 05 0d "orders.charge" 0a 02 05 03 "o-1" 05 06 "charge".
        assert_eq!(
            Key::build("orders.charge", &("o-1", "charge")).to_hex(),
            "43a5f6d8a6c7de3a62c5cc806e3685dc118dd8abd9b5a437d3662c70ad211b70"
        );
    }

    #[test]
    fn concatenations_do_not_collide() {
        assert_ne!(key_bytes(&("ab", "c")), key_bytes(&("a", "bc")));
        assert_ne!(Key::build("s", &("ab", "c")), Key::build("s", &("a", "bc")));
        assert_ne!(Key::build("s", &1u8), Key::build("t", &1u8));
        assert_ne!(Key::build("s", &1u8), Key::build("s", &1i8));
    }

    #[test]
    fn builder_matches_build_of_a_tuple_body() {
        let mut builder = KeyBuilder::new_static("scope");
        builder.part("a");
        builder.part(&7u32);
        let mut bytes = vec![0x05, 5];
        bytes.extend_from_slice(b"scope");
        bytes.extend(key_bytes("a"));
        bytes.extend(key_bytes(&7u32));
        let mut expected = Sha256::new();
        expected.update(b"samekey/key/v1");
        expected.update(&bytes);
        let expected: [u8; 32] = expected.finalize().into();
        assert_eq!(builder.finish().digest(), &expected);
    }

    #[test]
    fn windows_split_keys_by_bucket() {
        let day = 86_400_000;
        let at = |ms| {
            let mut b = KeyBuilder::new("signin");
            b.part(&42u64);
            b.window(day, ms);
            b.finish()
        };
        assert_eq!(at(day * 10 + 1), at(day * 11 - 1));
        assert_ne!(at(day * 10), at(day * 11));
    }

    #[test]
    fn only_a_top_level_none_is_missing() {
        let none: Option<String> = None;
        let some = Some("r-1".to_owned());
        let problem = |f: &dyn Fn(&mut KeyBuilder)| {
            let mut b = KeyBuilder::new("s");
            f(&mut b);
            b.problem().cloned()
        };
        assert_eq!(
            problem(&|b| b.named_part(&none, "request_id")),
            Some(KeyProblem::Missing("request_id"))
        );
        assert_eq!(
            problem(&|b| b.named_part(&&none, "request_id")),
            Some(KeyProblem::Missing("request_id"))
        );
        assert_eq!(
            problem(&|b| b.named_part(&Box::new(none.clone()), "request_id")),
            Some(KeyProblem::Missing("request_id"))
        );
        assert_eq!(problem(&|b| b.named_part(&some, "request_id")), None);
        // Inside a part, `None` is a value like any other.
        assert_eq!(
            problem(&|b| b.named_part(&(1u8, none.clone()), "pair")),
            None
        );
        assert_eq!(
            problem(&|b| b.named_part(&vec![none.clone()], "list")),
            None
        );
        // The first missing part is the one named; the key still encodes `None` as before.
        let mut b = KeyBuilder::new("s");
        b.named_part(&none, "a");
        b.named_part(&Option::<u8>::None, "b");
        assert_eq!(b.problem(), Some(&KeyProblem::Missing("a")));
        let mut plain = KeyBuilder::new("s");
        plain.part(&none);
        plain.part(&Option::<u8>::None);
        assert_eq!(b.finish(), plain.finish());
    }
}
