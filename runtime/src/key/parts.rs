//! The [`KeyPart`] impls of the standard types (integers of every width, `bool`, `char`, `()`,
//! strings, references and smart pointers, `Option`, slices, arrays, `Vec`, `VecDeque`, `BTreeSet`,
//! `BTreeMap`, tuples up to 12) and, behind their features, of `uuid::Uuid`, `chrono::NaiveDate` and
//! `serde_json::Value`. Each writes the tag and content the table in [the module doc](super) gives it;
//! the types left out (floats, hash maps and sets, clocks) are left out on purpose (see [`KeyPart`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;
use std::sync::Arc;

#[cfg(any(feature = "uuid", feature = "chrono", feature = "json"))]
use super::encode::tag;
use super::encode::KeyEncoder;
use super::KeyPart;

macro_rules! unsigned {
    ($($t:ty)*) => {$(
        impl KeyPart for $t {
            fn encode_key(&self, out: &mut KeyEncoder) {
                out.unsigned(*self as u128);
            }
        }
    )*};
}
unsigned!(u8 u16 u32 u64 u128 usize);

macro_rules! signed {
    ($($t:ty)*) => {$(
        impl KeyPart for $t {
            fn encode_key(&self, out: &mut KeyEncoder) {
                out.signed(*self as i128);
            }
        }
    )*};
}
signed!(i8 i16 i32 i64 i128 isize);

impl KeyPart for bool {
    fn encode_key(&self, out: &mut KeyEncoder) {
        out.boolean(*self);
    }
}

impl KeyPart for char {
    fn encode_key(&self, out: &mut KeyEncoder) {
        out.character(*self);
    }
}

impl KeyPart for () {
    fn encode_key(&self, out: &mut KeyEncoder) {
        out.unit();
    }
}

impl KeyPart for str {
    fn encode_key(&self, out: &mut KeyEncoder) {
        out.str(self);
    }
}

impl KeyPart for String {
    fn encode_key(&self, out: &mut KeyEncoder) {
        out.str(self);
    }
}

impl<T: KeyPart + ?Sized> KeyPart for &T {
    fn encode_key(&self, out: &mut KeyEncoder) {
        (**self).encode_key(out);
    }

    fn is_missing(&self) -> bool {
        (**self).is_missing()
    }
}

impl<T: KeyPart + ?Sized> KeyPart for &mut T {
    fn encode_key(&self, out: &mut KeyEncoder) {
        (**self).encode_key(out);
    }

    fn is_missing(&self) -> bool {
        (**self).is_missing()
    }
}

impl<T: KeyPart + ?Sized> KeyPart for Box<T> {
    fn encode_key(&self, out: &mut KeyEncoder) {
        (**self).encode_key(out);
    }

    fn is_missing(&self) -> bool {
        (**self).is_missing()
    }
}

impl<T: KeyPart + ?Sized> KeyPart for Rc<T> {
    fn encode_key(&self, out: &mut KeyEncoder) {
        (**self).encode_key(out);
    }

    fn is_missing(&self) -> bool {
        (**self).is_missing()
    }
}

impl<T: KeyPart + ?Sized> KeyPart for Arc<T> {
    fn encode_key(&self, out: &mut KeyEncoder) {
        (**self).encode_key(out);
    }

    fn is_missing(&self) -> bool {
        (**self).is_missing()
    }
}

impl<T: KeyPart + ToOwned + ?Sized> KeyPart for Cow<'_, T> {
    fn encode_key(&self, out: &mut KeyEncoder) {
        (**self).encode_key(out);
    }

    fn is_missing(&self) -> bool {
        (**self).is_missing()
    }
}

impl<T: KeyPart> KeyPart for Option<T> {
    fn encode_key(&self, out: &mut KeyEncoder) {
        match self {
            None => out.none(),
            Some(v) => {
                out.some();
                v.encode_key(out);
            }
        }
    }

    fn is_missing(&self) -> bool {
        self.is_none()
    }
}

impl<T: KeyPart> KeyPart for [T] {
    fn encode_key(&self, out: &mut KeyEncoder) {
        out.seq(self.len());
        for v in self {
            v.encode_key(out);
        }
    }
}

impl<T: KeyPart, const N: usize> KeyPart for [T; N] {
    fn encode_key(&self, out: &mut KeyEncoder) {
        self.as_slice().encode_key(out);
    }
}

impl<T: KeyPart> KeyPart for Vec<T> {
    fn encode_key(&self, out: &mut KeyEncoder) {
        self.as_slice().encode_key(out);
    }
}

impl<T: KeyPart> KeyPart for VecDeque<T> {
    fn encode_key(&self, out: &mut KeyEncoder) {
        out.seq(self.len());
        for v in self {
            v.encode_key(out);
        }
    }
}

impl<T: KeyPart> KeyPart for BTreeSet<T> {
    fn encode_key(&self, out: &mut KeyEncoder) {
        out.seq(self.len());
        for v in self {
            v.encode_key(out);
        }
    }
}

impl<K: KeyPart, V: KeyPart> KeyPart for BTreeMap<K, V> {
    fn encode_key(&self, out: &mut KeyEncoder) {
        out.map(self.len());
        for (k, v) in self {
            k.encode_key(out);
            v.encode_key(out);
        }
    }
}

macro_rules! tuple {
    ($n:expr; $($name:ident)+) => {
        impl<$($name: KeyPart),+> KeyPart for ($($name,)+) {
            #[allow(non_snake_case)]
            fn encode_key(&self, out: &mut KeyEncoder) {
                let ($($name,)+) = self;
                out.tuple($n);
                $($name.encode_key(out);)+
            }
        }
    };
}
tuple!(1; A);
tuple!(2; A B);
tuple!(3; A B C);
tuple!(4; A B C D);
tuple!(5; A B C D E);
tuple!(6; A B C D E F);
tuple!(7; A B C D E F G);
tuple!(8; A B C D E F G H);
tuple!(9; A B C D E F G H I);
tuple!(10; A B C D E F G H I J);
tuple!(11; A B C D E F G H I J K);
tuple!(12; A B C D E F G H I J K L);

#[cfg(feature = "uuid")]
impl KeyPart for uuid::Uuid {
    fn encode_key(&self, out: &mut KeyEncoder) {
        out.raw(&[tag::UUID]);
        out.raw(self.as_bytes());
    }
}

#[cfg(feature = "chrono")]
impl KeyPart for chrono::NaiveDate {
    fn encode_key(&self, out: &mut KeyEncoder) {
        use chrono::Datelike;
        let days = i128::from(self.num_days_from_ce());
        out.raw(&[tag::DATE]);
        out.varint(((days << 1) ^ (days >> 127)) as u128);
    }
}

/// A JSON value, canonically: object keys sorted (whatever order the document or `serde_json`'s
/// `preserve_order` gives them), integers by value whatever their JSON spelling of width. A number that
/// is not an integer is refused like every float: the call fails with `Error::InvalidKey` before
/// anything runs.
#[cfg(feature = "json")]
impl KeyPart for serde_json::Value {
    fn encode_key(&self, out: &mut KeyEncoder) {
        use serde_json::Value;
        out.raw(&[tag::JSON]);
        match self {
            Value::Null => out.raw(&[0]),
            Value::Bool(b) => {
                out.raw(&[1]);
                out.boolean(*b);
            }
            Value::Number(n) => {
                out.raw(&[2]);
                if let Some(u) = n.as_u64() {
                    out.unsigned(u128::from(u));
                } else if let Some(i) = n.as_i64() {
                    out.signed(i128::from(i));
                } else {
                    out.refuse("a JSON number that is not an integer: floats are not stable key parts (rounding, -0.0); send amounts in integer minor units");
                    // Refused, but still told apart: a `verify` fingerprint or a `Key::build` of
                    // two different floats must not be the same.
                    out.bytes(&n.as_f64().unwrap_or(f64::NAN).to_bits().to_be_bytes());
                }
            }
            Value::String(s) => {
                out.raw(&[3]);
                out.str(s);
            }
            Value::Array(items) => {
                out.raw(&[4]);
                out.seq(items.len());
                for item in items {
                    item.encode_key(out);
                }
            }
            Value::Object(map) => {
                out.raw(&[5]);
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                out.map(entries.len());
                for (k, v) in entries {
                    out.str(k);
                    v.encode_key(out);
                }
            }
        }
    }

    fn is_missing(&self) -> bool {
        self.is_null()
    }
}

#[cfg(all(test, feature = "json"))]
mod tests {
    use crate::key::{key_bytes, KeyBuilder, KeyProblem};

    #[test]
    fn json_values_encode_canonically_and_refuse_floats() {
        use serde_json::json;
        let a = json!({"b": [1, "x", null, true], "a": -3});
        let b: serde_json::Value =
            serde_json::from_str(r#"{"a": -3, "b": [1, "x", null, true]}"#).unwrap();
        assert_eq!(key_bytes(&a), key_bytes(&b));
        assert_eq!(
            key_bytes(&a),
            [
                0x12, 5, 0x0b, 2, // object, 2 entries
                0x05, 1, b'a', 0x12, 2, 0x02, 5, // "a": -3
                0x05, 1, b'b', 0x12, 4, 0x07, 4, // "b": [ 4 items
                0x12, 2, 0x01, 1, // 1
                0x12, 3, 0x05, 1, b'x', // "x"
                0x12, 0, // null
                0x12, 1, 0x03, 1, // true
            ]
        );
        assert_ne!(key_bytes(&json!("1")), key_bytes(&json!(1)));
        assert_ne!(key_bytes(&json!(null)), key_bytes(&json!([])));
        let mut builder = KeyBuilder::new("s");
        builder.named_part(&json!({"amount": 12.5}), "payload");
        assert!(matches!(
            builder.problem(),
            Some(KeyProblem::Refused("payload", reason)) if reason.contains("not an integer")
        ));
        let mut builder = KeyBuilder::new("s");
        builder.named_part(&json!(null), "payload");
        assert_eq!(builder.problem(), Some(&KeyProblem::Missing("payload")));
        let mut builder = KeyBuilder::new("s");
        builder.named_part(&json!({"a": null}), "payload");
        assert_eq!(builder.problem(), None);
    }
}
