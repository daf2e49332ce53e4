//! Keys as an operator gives them: a digest, or a scope and typed parts encoded exactly as the runtime
//! encodes them (its own `KeyBuilder`).

use samekey_runtime::{key::KeyBuilder, key::KeyEncoder, Key, KeyPart};

/// A structure's opening marker, as a type's `KeyPart` writes it before its members: a struct
/// (`#[derive(KeyPart)]`) of n kept fields, a tuple, a sequence of n items, an `Option`.
enum Marker {
    Record(usize),
    Tuple(usize),
    Seq(usize),
    Some,
    None,
}

impl KeyPart for Marker {
    fn encode_key(&self, out: &mut KeyEncoder) {
        match *self {
            Marker::Record(n) => out.record(n),
            Marker::Tuple(n) => out.tuple(n),
            Marker::Seq(n) => out.seq(n),
            Marker::Some => out.some(),
            Marker::None => out.none(),
        }
    }
}

/// A key from its digest (64 hex digits); its scope is not known.
pub fn from_digest(hex: &str) -> Result<Key, String> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return Err(format!("{hex:?} is not a key digest (64 hex digits)"));
    }
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("{hex:?} is not a key digest (64 hex digits)"))?;
    }
    Ok(Key::from_digest("", digest))
}

/// A key from its scope and parts, each `TYPE:VALUE` (str, bool, char, u8…u128, i8…i128), in the
/// order the function's `key = …` names them. A struct, tuple, sequence or `Option` part opens with
/// its marker — `record:N` (a `#[derive(KeyPart)]` struct of N kept fields), `tuple:N`, `seq:N`,
/// `some:`, `none:` — followed by its members.
pub fn from_parts(scope: &str, parts: &[String]) -> Result<Key, String> {
    let mut key = KeyBuilder::new(scope);
    for part in parts {
        let (ty, value) = part
            .split_once(':')
            .ok_or_else(|| format!("--part {part:?}: write TYPE:VALUE, e.g. str:o-1 or u64:42"))?;
        let bad = |e: &dyn std::fmt::Display| format!("--part {part:?}: not a {ty}: {e}");
        macro_rules! typed {
            ($($name:literal => $t:ty),*) => {
                let count = || {
                    value
                        .parse::<usize>()
                        .map_err(|e| format!("--part {part:?}: {ty} takes a count: {e}"))
                };
                match ty {
                    "str" | "string" => key.part(value),
                    "record" => key.part(&Marker::Record(count()?)),
                    "tuple" => key.part(&Marker::Tuple(count()?)),
                    "seq" => key.part(&Marker::Seq(count()?)),
                    "some" => key.part(&Marker::Some),
                    "none" => key.part(&Marker::None),
                    $($name => key.part(&value.parse::<$t>().map_err(|e| bad(&e))?),)*
                    other => {
                        return Err(format!(
                            "--part {part:?}: unknown type {other:?} (str, bool, char, u8…u128, i8…i128, record:N, tuple:N, seq:N, some:, none:)"
                        ))
                    }
                }
            };
        }
        typed!("bool" => bool, "char" => char, "u8" => u8, "u16" => u16, "u32" => u32, "u64" => u64,
               "u128" => u128, "usize" => usize, "i8" => i8, "i16" => i16, "i32" => i32, "i64" => i64,
               "i128" => i128, "isize" => isize);
    }
    Ok(key.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_encode_as_the_runtime_does() {
        let mut expected = KeyBuilder::new("orders.charge");
        expected.part(&42u64);
        expected.part("charge");
        let expected = expected.finish();
        let parts = ["u64:42".to_owned(), "str:charge".to_owned()];
        assert_eq!(from_parts("orders.charge", &parts).unwrap(), expected);
        assert_eq!(
            from_digest(&expected.to_hex()).unwrap().digest(),
            expected.digest()
        );
        assert!(from_parts("s", &["u64:x".to_owned()]).is_err());

        // A struct part, as `#[derive(KeyPart)]` writes it: its marker, then its kept fields.
        struct Order {
            id: u64,
        }
        impl KeyPart for Order {
            fn encode_key(&self, out: &mut KeyEncoder) {
                out.record(1);
                self.id.encode_key(out);
            }
        }
        let mut expected = KeyBuilder::new("orders.charge");
        expected.part(&Order { id: 4 });
        let parts = ["record:1".to_owned(), "u64:4".to_owned()];
        assert_eq!(
            from_parts("orders.charge", &parts).unwrap(),
            expected.finish()
        );
        assert!(from_parts("s", &["record:x".to_owned()]).is_err());
        assert!(from_parts("s", &["float:1".to_owned()]).is_err());
        assert!(from_digest("abc").is_err());
    }
}
