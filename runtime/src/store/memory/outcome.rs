//! A record's encoded outcome as the store keeps it: a short one inside the record itself, a longer
//! one shared.
//!
//! Most outcomes are a few dozen bytes of JSON. Kept in the record, they cost no allocation of their
//! own, and reading or evicting the record loads nothing from elsewhere in the heap (in a store of
//! 10⁵ receipts, a separate allocation is one more cache and TLB miss for every receipt evicted: the
//! largest cost left of a fresh call at steady state).

use std::sync::Arc;

/// The longest outcome kept inside its record: with its length and the variant, one cache line.
const INLINE: usize = 62;

#[derive(Default)]
pub(super) enum Outcome {
    /// None (in flight, `UNKNOWN`, or not encodable).
    #[default]
    None,
    /// Up to [`INLINE`] bytes: `bytes[..len]`.
    Inline { len: u8, bytes: [u8; INLINE] },
    /// Longer.
    Shared(Arc<[u8]>),
}

impl Outcome {
    /// The outcome `encoded`, kept inline if short.
    pub(super) fn new(encoded: Option<Arc<[u8]>>) -> Outcome {
        match encoded {
            None => Outcome::None,
            Some(shared) => match u8::try_from(shared.len()) {
                Ok(len) if shared.len() <= INLINE => {
                    let mut bytes = [0; INLINE];
                    bytes[..shared.len()].copy_from_slice(&shared);
                    Outcome::Inline { len, bytes }
                }
                _ => Outcome::Shared(shared),
            },
        }
    }

    pub(super) fn bytes(&self) -> Option<&[u8]> {
        match self {
            Outcome::None => None,
            Outcome::Inline { len, bytes } => bytes.get(..usize::from(*len)),
            Outcome::Shared(shared) => Some(shared),
        }
    }

    /// The outcome as a [`Receipt`](crate::receipt::Receipt) holds it (a short one copied out).
    pub(super) fn shared(&self) -> Option<Arc<[u8]>> {
        match self {
            Outcome::Shared(shared) => Some(shared.clone()),
            inline => inline.bytes().map(Arc::from),
        }
    }

    /// Where a shared outcome's allocation starts (its reference counts): what evicting the record
    /// writes beyond the record itself. `None` for an outcome kept inline.
    pub(super) fn allocation(&self) -> Option<*const u8> {
        match self {
            Outcome::Shared(shared) => Some(shared.as_ptr().wrapping_sub(2 * size_of::<usize>())),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_outcomes_are_kept_inline_and_long_ones_shared_byte_for_byte() {
        assert!(Outcome::new(None).bytes().is_none());
        assert!(Outcome::new(None).shared().is_none());
        for len in [0, 1, INLINE - 1, INLINE, INLINE + 1, 4096] {
            let encoded: Arc<[u8]> = (0..len).map(|i| (i % 251) as u8).collect();
            let kept = Outcome::new(Some(encoded.clone()));
            assert_eq!(
                matches!(kept, Outcome::Inline { .. }),
                len <= INLINE,
                "{len} bytes"
            );
            assert_eq!(kept.bytes(), Some(&encoded[..]));
            assert_eq!(kept.shared().as_deref(), Some(&encoded[..]));
            assert_eq!(kept.allocation().is_some(), len > INLINE);
        }
        assert_eq!(size_of::<Outcome>(), 64);
    }
}
