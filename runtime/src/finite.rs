//! Whether a value holds a float JSON cannot carry: a NaN or an infinity. serde_json writes one as
//! `null`, which a duplicate would read back as something else (`Some(NaN)` as `None`) or not at all,
//! so an outcome holding one is refused before it is stored.
//!
//! The walk runs the value's `Serialize` a second time, and only when its encoding holds a `null`:
//! a `Serialize` must answer the same each time it runs (one that panics the second time leaves its
//! call `UNKNOWN`, its key held, as any panic after the body does).

use std::fmt;

use serde::ser::{self, Serialize};

/// Refuses `value` if it holds a NaN or an infinite `f32` or `f64` anywhere. Walks the value through its
/// `Serialize` without writing anything; a `Serialize` that fails for another reason is not refused
/// here (the encoding reports that failure itself).
pub(crate) fn refuse_non_finite<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<()> {
    match value.serialize(Finder) {
        Err(Found::NonFinite) => Err(ser::Error::custom(
            "a NaN or infinite float has no JSON form (it would be read back as null): not stored",
        )),
        _ => Ok(()),
    }
}

/// Whether a JSON encoding holds a `null` (outside strings, or inside one: a cheap first look, before
/// [`refuse_non_finite`] walks the value).
pub(crate) fn holds_null(bytes: &[u8]) -> bool {
    bytes.windows(4).any(|w| w == b"null")
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

/// Methods that take a scalar and find nothing in it.
macro_rules! nothing_in {
    ($($method:ident($($arg:ty),*);)*) => {
        $(fn $method(self, $(_: $arg),*) -> Done {
            Ok(())
        })*
    };
}

/// Methods that begin a compound value: its parts are walked by the `Serialize*` impls below.
macro_rules! compound {
    ($($method:ident($($arg:ty),*);)*) => {
        $(fn $method(self, $(_: $arg),*) -> Result<Finder, Found> {
            Ok(Finder)
        })*
    };
}

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
        self.serialize_f64(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Done {
        if v.is_finite() {
            Ok(())
        } else {
            Err(Found::NonFinite)
        }
    }
    nothing_in! {
        serialize_bool(bool); serialize_char(char); serialize_str(&str); serialize_bytes(&[u8]);
        serialize_i8(i8); serialize_i16(i16); serialize_i32(i32); serialize_i64(i64);
        serialize_i128(i128); serialize_u8(u8); serialize_u16(u16); serialize_u32(u32);
        serialize_u64(u64); serialize_u128(u128); serialize_none(); serialize_unit();
        serialize_unit_struct(&'static str);
        serialize_unit_variant(&'static str, u32, &'static str);
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Done {
        value.serialize(Finder)
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
    compound! {
        serialize_seq(Option<usize>); serialize_tuple(usize);
        serialize_tuple_struct(&'static str, usize);
        serialize_tuple_variant(&'static str, u32, &'static str, usize);
        serialize_map(Option<usize>); serialize_struct(&'static str, usize);
        serialize_struct_variant(&'static str, u32, &'static str, usize);
    }
}

/// The `Serialize*` impls of [`Finder`]: each part is walked in turn.
macro_rules! parts {
    ($($trait:ident::$method:ident($($name:ty),*);)*) => {
        $(impl ser::$trait for Finder {
            type Ok = ();
            type Error = Found;
            fn $method<T: Serialize + ?Sized>(&mut self, $(_: $name,)* value: &T) -> Done {
                value.serialize(Finder)
            }
            fn end(self) -> Done {
                Ok(())
            }
        })*
    };
}

parts! {
    SerializeSeq::serialize_element();
    SerializeTuple::serialize_element();
    SerializeTupleStruct::serialize_field();
    SerializeTupleVariant::serialize_field();
    SerializeStruct::serialize_field(&'static str);
    SerializeStructVariant::serialize_field(&'static str);
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn holds_non_finite<T: Serialize + ?Sized>(value: &T) -> bool {
        refuse_non_finite(value).is_err()
    }

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
