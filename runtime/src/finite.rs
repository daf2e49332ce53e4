//! Whether a value holds a float JSON cannot carry: a NaN or an infinity. serde_json writes one as
//! `null`, which a duplicate would read back as something else (`Some(NaN)` as `None`) or not at all,
//! so an outcome holding one is refused before it is stored.
//!
//! The walk runs the value's `Serialize` a second time, and only when its encoding holds a `null`:
//! a `Serialize` must answer the same each time it runs (one that panics the second time leaves its
//! call `UNKNOWN`, its key held, as any panic after the body does).

use std::fmt;

use serde::ser::{self, Serialize};

/// Whether `value` holds a NaN or an infinite `f32` or `f64` anywhere. Walks the value through its
/// `Serialize` without writing anything; a `Serialize` that fails for another reason answers `false`
/// (the encoding reports that failure itself).
pub(crate) fn holds_non_finite<T: Serialize + ?Sized>(value: &T) -> bool {
    matches!(value.serialize(Finder), Err(Found::NonFinite))
}

/// Whether a JSON encoding holds a `null` (outside strings, or inside one: a cheap first look, before
/// [`holds_non_finite`] walks the value).
pub(crate) fn holds_null(bytes: &[u8]) -> bool {
    bytes.windows(4).any(|w| w == b"null")
}

/// The refusal [`holds_non_finite`] reports as an encoding error.
pub(crate) fn refusal() -> serde_json::Error {
    ser::Error::custom(
        "a NaN or infinite float has no JSON form (it would be read back as null): not stored",
    )
}

#[derive(Debug)]
enum Found {
    NonFinite,
    Other,
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Found::NonFinite => "a non-finite float",
            Found::Other => "a serialization error",
        })
    }
}

impl std::error::Error for Found {}

impl ser::Error for Found {
    fn custom<M: fmt::Display>(_msg: M) -> Found {
        Found::Other
    }
}

/// A serializer that writes nothing and stops at the first non-finite float.
struct Finder;

type Done = Result<(), Found>;

impl ser::Serializer for Finder {
    type Ok = ();
    type Error = Found;
    type SerializeSeq = Finder;
    type SerializeTuple = Finder;
    type SerializeTupleStruct = Finder;
    type SerializeTupleVariant = Finder;
    type SerializeMap = Finder;
    type SerializeStruct = Finder;
    type SerializeStructVariant = Finder;

    fn serialize_f32(self, v: f32) -> Done {
        if v.is_finite() {
            Ok(())
        } else {
            Err(Found::NonFinite)
        }
    }
    fn serialize_f64(self, v: f64) -> Done {
        if v.is_finite() {
            Ok(())
        } else {
            Err(Found::NonFinite)
        }
    }
    fn serialize_bool(self, _: bool) -> Done {
        Ok(())
    }
    fn serialize_i8(self, _: i8) -> Done {
        Ok(())
    }
    fn serialize_i16(self, _: i16) -> Done {
        Ok(())
    }
    fn serialize_i32(self, _: i32) -> Done {
        Ok(())
    }
    fn serialize_i64(self, _: i64) -> Done {
        Ok(())
    }
    fn serialize_i128(self, _: i128) -> Done {
        Ok(())
    }
    fn serialize_u8(self, _: u8) -> Done {
        Ok(())
    }
    fn serialize_u16(self, _: u16) -> Done {
        Ok(())
    }
    fn serialize_u32(self, _: u32) -> Done {
        Ok(())
    }
    fn serialize_u64(self, _: u64) -> Done {
        Ok(())
    }
    fn serialize_u128(self, _: u128) -> Done {
        Ok(())
    }
    fn serialize_char(self, _: char) -> Done {
        Ok(())
    }
    fn serialize_str(self, _: &str) -> Done {
        Ok(())
    }
    fn serialize_bytes(self, _: &[u8]) -> Done {
        Ok(())
    }
    fn serialize_none(self) -> Done {
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Done {
        value.serialize(Finder)
    }
    fn serialize_unit(self) -> Done {
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Done {
        Ok(())
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Done {
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Done {
        value.serialize(Finder)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        value: &T,
    ) -> Done {
        value.serialize(Finder)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Finder, Found> {
        Ok(Finder)
    }
    fn serialize_tuple(self, _: usize) -> Result<Finder, Found> {
        Ok(Finder)
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Finder, Found> {
        Ok(Finder)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Finder, Found> {
        Ok(Finder)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Finder, Found> {
        Ok(Finder)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Finder, Found> {
        Ok(Finder)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Finder, Found> {
        Ok(Finder)
    }
}

impl ser::SerializeSeq for Finder {
    type Ok = ();
    type Error = Found;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
        value.serialize(Finder)
    }
    fn end(self) -> Done {
        Ok(())
    }
}

impl ser::SerializeTuple for Finder {
    type Ok = ();
    type Error = Found;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
        value.serialize(Finder)
    }
    fn end(self) -> Done {
        Ok(())
    }
}

impl ser::SerializeTupleStruct for Finder {
    type Ok = ();
    type Error = Found;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
        value.serialize(Finder)
    }
    fn end(self) -> Done {
        Ok(())
    }
}

impl ser::SerializeTupleVariant for Finder {
    type Ok = ();
    type Error = Found;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
        value.serialize(Finder)
    }
    fn end(self) -> Done {
        Ok(())
    }
}

impl ser::SerializeMap for Finder {
    type Ok = ();
    type Error = Found;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Done {
        key.serialize(Finder)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
        value.serialize(Finder)
    }
    fn end(self) -> Done {
        Ok(())
    }
}

impl ser::SerializeStruct for Finder {
    type Ok = ();
    type Error = Found;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, _: &'static str, value: &T) -> Done {
        value.serialize(Finder)
    }
    fn end(self) -> Done {
        Ok(())
    }
}

impl ser::SerializeStructVariant for Finder {
    type Ok = ();
    type Error = Found;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, _: &'static str, value: &T) -> Done {
        value.serialize(Finder)
    }
    fn end(self) -> Done {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn finds_a_non_finite_float_wherever_it_is() {
        assert!(holds_non_finite(&f64::NAN));
        assert!(holds_non_finite(&Some(f64::NAN)));
        assert!(holds_non_finite(&Some(f32::INFINITY)));
        assert!(holds_non_finite(&vec![1.0, f64::NEG_INFINITY]));
        assert!(holds_non_finite(&(1, Some((2, f64::NAN)))));
        assert!(holds_non_finite(&BTreeMap::from([("a", f64::NAN)])));
        assert!(!holds_non_finite(&serde_json::json!({"x": [1, 2]})));
        assert!(!holds_non_finite(&Some(1.5_f64)));
        assert!(!holds_non_finite(&None::<f64>));
        assert!(!holds_non_finite(&"null"));
        assert!(!holds_non_finite(&()));
    }
}
