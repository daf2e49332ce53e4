// Generics with bounds and a `where` clause, explicit lifetimes, `impl Trait` arguments (cloned per
// attempt, and moved by the body), `&mut` arguments, destructured parameters, a `Result` alias as return type, attributes
// and docs on the function.
#![deny(warnings)]
use samekey::{idempotent, Classify, ErrorClass, KeyPart};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed(String);

impl Classify for Failed {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Permanent
    }
}

impl From<samekey::Error> for Failed {
    fn from(e: samekey::Error) -> Self {
        Failed(e.to_string())
    }
}

type Res<T> = Result<T, Failed>;

/// Documented.
#[inline]
#[idempotent(key = "id + pair.0 + a")]
pub(crate) async fn generic<'a, T, K: KeyPart + ?Sized>(
    id: &'a K,
    value: T,
    pair: (u64, &'a str),
    (a, mut b): (u32, u32),
    name: impl AsRef<str> + Clone,
    note: impl Into<String> + Clone,
    counter: &mut u64,
) -> Res<Vec<T>>
where
    T: Clone + Serialize + for<'de> Deserialize<'de> + Send,
{
    b += a;
    *counter += u64::from(b);
    let _ = name.as_ref().len();
    let _note: String = note.into();
    let _ = pair.1;
    Ok(vec![value])
}

fn main() {}
