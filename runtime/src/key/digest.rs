//! What is made of a finished digest: the [`Fingerprint`] of the `verify` parts, the [`ShortKey`] that
//! logs show, and the hex form of digests that people read and the Redis store writes.

use std::fmt;

use super::Key;

/// Display helper returned by [`Key::short`].
pub struct ShortKey<'a>(pub(super) &'a Key);

impl fmt::Display for ShortKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0.digest[..8]))
    }
}

/// A fingerprint of the `verify` parts: a replay whose fingerprint differs is a reuse of the key for a
/// different request, answered with [`Error::KeyReuse`](crate::Error::KeyReuse).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", hex(&self.0[..8]))
    }
}

/// The digest written by [`Key::to_hex`]: 64 hex digits (either case), else `None`.
#[cfg(feature = "redis")]
pub(crate) fn digest_from_hex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut digest = [0u8; 32];
    for (byte, pair) in digest.iter_mut().zip(text.as_bytes().chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(digest)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}
