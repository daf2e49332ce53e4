//! Writing key parts: the tags of the encoding table (see [the module doc](super)) and the
//! [`KeyEncoder`] that writes a value's tag and content into a SHA-256 state (for a
//! [`KeyBuilder`](super::KeyBuilder)) or a byte buffer (for [`key_bytes`]); [`KeyBytes`], raw bytes as
//! one part.

use sha2::{Digest, Sha256};

use super::KeyPart;

/// The one-byte tag each value starts with (the table in [the module doc](super)).
pub(super) mod tag {
    pub const UNIT: u8 = 0x00;
    pub const UNSIGNED: u8 = 0x01;
    pub const SIGNED: u8 = 0x02;
    pub const BOOL: u8 = 0x03;
    pub const CHAR: u8 = 0x04;
    pub const STR: u8 = 0x05;
    pub const BYTES: u8 = 0x06;
    pub const SEQ: u8 = 0x07;
    pub const NONE: u8 = 0x08;
    pub const SOME: u8 = 0x09;
    pub const TUPLE: u8 = 0x0a;
    pub const MAP: u8 = 0x0b;
    pub const RECORD: u8 = 0x0c;
    pub const VARIANT: u8 = 0x0d;
    #[cfg(feature = "uuid")]
    pub const UUID: u8 = 0x10;
    #[cfg(feature = "chrono")]
    pub const DATE: u8 = 0x11;
    #[cfg(feature = "json")]
    pub const JSON: u8 = 0x12;
    pub const WINDOW: u8 = 0x1f;
}

/// Receives the encoding of key parts: either straight into a SHA-256 state (how keys are made, with no
/// allocation) or into a byte buffer (see [`key_bytes`]).
pub struct KeyEncoder {
    sink: Sink,
    /// Why a value could not be encoded, when one could not.
    pub(super) refused: Option<&'static str>,
}

enum Sink {
    Hash(Sha256),
    Bytes(Vec<u8>),
}

impl KeyEncoder {
    #[inline]
    pub(super) fn hashing() -> KeyEncoder {
        let mut hasher = Sha256::new();
        hasher.update(b"samekey/key/v1");
        KeyEncoder {
            sink: Sink::Hash(hasher),
            refused: None,
        }
    }

    #[inline]
    pub(super) fn raw(&mut self, bytes: &[u8]) {
        match &mut self.sink {
            Sink::Hash(h) => h.update(bytes),
            Sink::Bytes(b) => b.extend_from_slice(bytes),
        }
    }

    #[inline]
    pub(super) fn varint(&mut self, mut v: u128) {
        let mut buf = [0u8; 19];
        let mut n = 0;
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                buf[n] = byte;
                n += 1;
                break;
            }
            buf[n] = byte | 0x80;
            n += 1;
        }
        self.raw(&buf[..n]);
    }

    #[inline]
    fn tagged_len(&mut self, tag: u8, len: usize) {
        self.raw(&[tag]);
        self.varint(len as u128);
    }

    /// Refuses the value being encoded: it has no stable encoding (a float inside a JSON value). The call
    /// fails with `Error::InvalidKey` carrying `reason` before anything runs. Types with no stable
    /// encoding at all should not implement [`KeyPart`]: they are then refused at compile time.
    pub fn refuse(&mut self, reason: &'static str) {
        self.refused.get_or_insert(reason);
    }

    /// The unit value `()`.
    pub fn unit(&mut self) {
        self.raw(&[tag::UNIT]);
    }

    /// An unsigned integer of any width.
    #[inline]
    pub fn unsigned(&mut self, v: u128) {
        self.raw(&[tag::UNSIGNED]);
        self.varint(v);
    }

    /// A signed integer of any width.
    pub fn signed(&mut self, v: i128) {
        self.raw(&[tag::SIGNED]);
        self.varint(((v << 1) ^ (v >> 127)) as u128);
    }

    /// A boolean.
    pub fn boolean(&mut self, v: bool) {
        self.raw(&[tag::BOOL, u8::from(v)]);
    }

    /// A character.
    pub fn character(&mut self, v: char) {
        self.raw(&[tag::CHAR]);
        self.varint(u128::from(u32::from(v)));
    }

    /// A string.
    #[inline]
    pub fn str(&mut self, v: &str) {
        self.tagged_len(tag::STR, v.len());
        self.raw(v.as_bytes());
    }

    /// Raw bytes (see [`KeyBytes`]).
    pub fn bytes(&mut self, v: &[u8]) {
        self.tagged_len(tag::BYTES, v.len());
        self.raw(v);
    }

    /// The start of a sequence of `len` elements; encode the elements next.
    pub fn seq(&mut self, len: usize) {
        self.tagged_len(tag::SEQ, len);
    }

    /// `None`.
    pub fn none(&mut self) {
        self.raw(&[tag::NONE]);
    }

    /// The start of `Some(v)`; encode `v` next.
    pub fn some(&mut self) {
        self.raw(&[tag::SOME]);
    }

    /// The start of a tuple of `arity` elements; encode the elements next.
    pub fn tuple(&mut self, arity: usize) {
        self.tagged_len(tag::TUPLE, arity);
    }

    /// The start of a map of `len` entries; encode each key then its value next, in ascending key order.
    pub fn map(&mut self, len: usize) {
        self.tagged_len(tag::MAP, len);
    }

    /// The start of a struct of `fields` fields; encode the fields next, in declaration order.
    pub fn record(&mut self, fields: usize) {
        self.tagged_len(tag::RECORD, fields);
    }

    /// The start of the enum variant `name` with `fields` fields; encode the fields next.
    pub fn variant(&mut self, name: &str, fields: usize) {
        self.raw(&[tag::VARIANT]);
        self.varint(name.len() as u128);
        self.raw(name.as_bytes());
        self.varint(fields as u128);
    }

    pub(super) fn window(&mut self, window_ms: u64, bucket: u64) {
        self.raw(&[tag::WINDOW]);
        self.varint(u128::from(window_ms));
        self.varint(u128::from(bucket));
    }

    #[inline]
    pub(super) fn finish(self) -> [u8; 32] {
        match self.sink {
            Sink::Hash(h) => h.finalize().into(),
            Sink::Bytes(b) => Sha256::digest(b).into(),
        }
    }
}

/// The encoding of one key part, as bytes. Useful to check by hand what a part contributes to a key.
///
/// ```
/// assert_eq!(samekey_runtime::key::key_bytes(&("ab", 7u32)), [0x0a, 2, 0x05, 2, b'a', b'b', 0x01, 7]);
/// ```
pub fn key_bytes<P: KeyPart + ?Sized>(part: &P) -> Vec<u8> {
    let mut encoder = KeyEncoder {
        sink: Sink::Bytes(Vec::new()),
        refused: None,
    };
    part.encode_key(&mut encoder);
    match encoder.sink {
        Sink::Bytes(b) => b,
        Sink::Hash(_) => Vec::new(),
    }
}

/// Raw bytes as one key part (tag 0x06), more compact than a `&[u8]`, which encodes as a sequence of
/// integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyBytes<'a>(pub &'a [u8]);

impl KeyPart for KeyBytes<'_> {
    fn encode_key(&self, out: &mut KeyEncoder) {
        out.bytes(self.0);
    }
}
