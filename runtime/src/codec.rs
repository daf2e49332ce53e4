//! How a call's failure is stored and replayed: exactly with serde when the error type implements
//! `Serialize` and `Deserialize`, else by its message. (The success value is always stored with serde.)
//!
//! Real error types often hold what serde cannot (`#[from] reqwest::Error`, `sqlx::Error`,
//! `io::Error`). Such an error is stored as its `Display` text, and a duplicate gets
//! [`Error::Failed`](crate::Error::Failed) with that text through the function's
//! `From<samekey::Error>`: the same answer ("it failed, and why"), in the one variant the function
//! already handles. The choice is made per function, at compile time, by the code `#[idempotent]`
//! generates ([`Probe`]).

use std::any::Any;
use std::cell::RefCell;
use std::fmt::Display;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::finite;

/// How one function's failures are written and read back.
pub struct ErrorCodec<E> {
    pub(crate) encode: fn(&E) -> serde_json::Result<Arc<[u8]>>,
    /// The stored failure: the error itself, or (`Err`) the message it was stored by.
    pub(crate) decode: fn(&[u8]) -> serde_json::Result<Result<E, String>>,
}

/// A failure stored by its message. Unknown fields are refused, so that a stored error of the user's type
/// is never read as one.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ByMessage {
    #[serde(rename = "samekey.failure")]
    message: String,
}

/// The largest buffer [`shared_json`] keeps for its thread's next value.
const SCRATCH_KEPT: usize = 4096;

/// `value` as JSON, in its shared form: written into a buffer kept per thread, then copied once into
/// the `Arc` the store keeps. One allocation a value instead of `serde_json::to_vec`'s growing `Vec`
/// and its copy; a buffer grown past [`SCRATCH_KEPT`] by a large value is not kept.
pub(crate) fn shared_json<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<Arc<[u8]>> {
    thread_local! {
        static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    let on_its_own = || serde_json::to_vec(value).map(Arc::from);
    SCRATCH
        .try_with(|scratch| {
            // Taken already: a `Serialize` impl that encodes another outcome on this thread.
            let Ok(mut buffer) = scratch.try_borrow_mut() else {
                return on_its_own();
            };
            buffer.clear();
            let encoded =
                serde_json::to_writer(&mut *buffer, value).map(|()| Arc::from(&buffer[..]));
            if buffer.capacity() > SCRATCH_KEPT {
                *buffer = Vec::new();
            }
            encoded
        })
        // The thread is ending and its buffer is gone (a call finished by a thread-local's drop).
        .unwrap_or_else(|_| on_its_own())
}

/// A call's outcome as it is stored ([`shared_json`]), refused when a duplicate could not read it
/// back as it was. JSON carries no NaN or infinite float, and serde_json writes one as `null`, which
/// reads back as something else (`Some(NaN)` as `None`) or not at all: an encoding that holds a
/// `null` — the one look every outcome gets — is refused if the value holds such a float, or if it
/// does not read back.
pub(crate) fn replayable_json<T: Serialize + DeserializeOwned>(
    value: &T,
) -> serde_json::Result<Arc<[u8]>> {
    let bytes = shared_json(value)?;
    if finite::holds_null(&bytes) {
        finite::refuse_non_finite(value)?;
        serde_json::from_slice::<T>(&bytes)
            .map_err(|e| serde::ser::Error::custom(format_args!("it cannot be read back: {e}")))?;
    }
    Ok(bytes)
}

/// `value` as JSON in a `Vec`, refused when it holds a NaN or an infinite float (which JSON writes as
/// `null` and a duplicate would read back as something else): what a store's `complete_in`, a
/// callback and the compensation worker store, and a call's kept inputs.
pub(crate) fn stored_json<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<Vec<u8>> {
    let bytes = serde_json::to_vec(value)?;
    if finite::holds_null(&bytes) {
        finite::refuse_non_finite(value)?;
    }
    Ok(bytes)
}

/// A failure stored by its message, as the message codec writes it: what the compensation worker
/// records for a failure it learns of, so that duplicates replay it as `Error::Failed`.
pub(crate) fn message_bytes(message: &str) -> Vec<u8> {
    serde_json::to_vec(&ByMessage {
        message: message.to_owned(),
    })
    .unwrap_or_default()
}

impl<E> ErrorCodec<E> {
    /// `error` in a few words for the journal: its message when it is stored by message, else its
    /// stored (JSON) form; at most 200 characters.
    pub(crate) fn describe(&self, error: &E) -> String {
        let Ok(bytes) = (self.encode)(error) else {
            return "(cannot be encoded)".to_owned();
        };
        let text = match serde_json::from_slice::<ByMessage>(&bytes) {
            Ok(stored) => stored.message,
            // A unit variant (`"Reset"`) reads better without its quotes.
            Err(_) => match serde_json::from_slice::<String>(&bytes) {
                Ok(name) => name,
                Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
            },
        };
        bounded(text, 200)
    }
}

/// `text`, cut to its first `chars` characters (and an ellipsis) when longer: what samekey writes
/// from user errors — a journal line, a compensation entry's reason — never outgrows a column.
pub(crate) fn bounded(text: String, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text,
    }
}

/// A replayed value kept decoded, of whichever type kept it.
pub(crate) type Kept = Arc<dyn Any + Send + Sync>;

/// How the in-process store keeps a function's replayed value decoded, for a value type `T` that is
/// `Clone` (picked by [`ValueProbe`]): the first replay decodes the stored JSON and keeps a copy
/// beside the receipt; later replays clone it. The stored bytes stay what every store holds.
pub struct Keeper<T> {
    pub(crate) keep: fn(&T) -> Kept,
    pub(crate) take: fn(&(dyn Any + Send + Sync)) -> Option<T>,
}

/// Picks a function's [`Keeper`] by what its value type `T` implements:
/// `(&&ValueProbe::<T>::new()).keeper()` is `Some` when `T` is `Clone + Send + Sync + 'static`, else
/// `None` (replays decode the stored JSON each time). In generic code, where the bounds are not
/// known, it is `None`.
pub struct ValueProbe<T>(PhantomData<fn() -> T>);

impl<T> ValueProbe<T> {
    /// A probe for the value type `T`.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> ValueProbe<T> {
        ValueProbe(PhantomData)
    }
}

/// The first choice of [`ValueProbe`]: a `Clone` value is kept decoded.
pub trait KeptValues<T> {
    /// The keeper.
    fn keeper(&self) -> Option<Keeper<T>>;
}

impl<T: Clone + Send + Sync + 'static> KeptValues<T> for &ValueProbe<T> {
    fn keeper(&self) -> Option<Keeper<T>> {
        Some(Keeper {
            keep: |value| Arc::new(value.clone()),
            take: |kept| kept.downcast_ref::<T>().cloned(),
        })
    }
}

/// The fallback of [`ValueProbe`]: other values are decoded on every replay.
pub trait DecodedValues<T> {
    /// No keeper.
    fn keeper(&self) -> Option<Keeper<T>>;
}

impl<T> DecodedValues<T> for ValueProbe<T> {
    fn keeper(&self) -> Option<Keeper<T>> {
        None
    }
}

/// Picks a function's [`ErrorCodec`] by what its error type `E` implements:
/// `(&&Probe::<E>::new()).codec()` is the exact (serde) codec when `E` has serde, else the message
/// codec (method resolution tries [`ExactErrors`], implemented for `&Probe`, before
/// [`MessageErrors`]).
pub struct Probe<E>(PhantomData<fn() -> E>);

impl<E> Probe<E> {
    /// A probe for the error type `E`.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Probe<E> {
        Probe(PhantomData)
    }
}

/// The first choice of [`Probe`]: errors with serde are stored and replayed exactly.
pub trait ExactErrors<E> {
    /// The codec.
    fn codec(&self) -> ErrorCodec<E>;
}

impl<E: Serialize + DeserializeOwned> ExactErrors<E> for &Probe<E> {
    fn codec(&self) -> ErrorCodec<E> {
        ErrorCodec {
            encode: replayable_json,
            // A failure stored by message (by a build whose error type had no serde) still replays. It
            // is tried first: an `E` whose fields all have defaults would read it as itself.
            decode: |b| match serde_json::from_slice::<ByMessage>(b) {
                Ok(stored) => Ok(Err(stored.message)),
                Err(_) => serde_json::from_slice(b).map(Ok),
            },
        }
    }
}

/// The fallback of [`Probe`]: errors without serde are stored by their message.
pub trait MessageErrors<E> {
    /// The codec.
    fn codec(&self) -> ErrorCodec<E>
    where
        E: StoredByMessage;
}

impl<E> MessageErrors<E> for Probe<E> {
    fn codec(&self) -> ErrorCodec<E>
    where
        E: StoredByMessage,
    {
        ErrorCodec {
            encode: |e| {
                shared_json(&ByMessage {
                    message: e.to_string(),
                })
            },
            decode: |b| {
                Ok(Err(match serde_json::from_slice::<ByMessage>(b) {
                    Ok(stored) => stored.message,
                    // Stored exactly by a build whose error type had serde: its JSON is the message.
                    Err(_) => String::from_utf8_lossy(b).into_owned(),
                }))
            },
        }
    }
}

/// An error type whose failures can be stored by their message: anything that implements `Display`.
#[diagnostic::on_unimplemented(
    message = "the failures of `{Self}` cannot be stored: it implements neither `Display` nor serde",
    label = "a permanent failure is stored and replayed to duplicates",
    note = "implement `Display` (e.g. `#[derive(thiserror::Error)]`): a duplicate then gets `samekey::Error::Failed` with the message, through your `From<samekey::Error>`",
    note = "or derive `serde::Serialize` and `serde::Deserialize`: a duplicate then gets the error itself"
)]
pub trait StoredByMessage: Display {}

#[diagnostic::do_not_recommend]
impl<E: Display> StoredByMessage for E {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encodes another value from inside its own `Serialize`, while the thread's buffer is taken.
    struct Nested(u32);

    impl Serialize for Nested {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let inner = shared_json(&[self.0, self.0 + 1]).map_err(serde::ser::Error::custom)?;
            serializer
                .serialize_str(std::str::from_utf8(&inner).map_err(serde::ser::Error::custom)?)
        }
    }

    #[test]
    fn shared_json_writes_what_to_vec_writes() {
        let values = [
            serde_json::json!({"order_id": 7, "amount": 500}),
            serde_json::json!("x".repeat(3 * SCRATCH_KEPT)),
            serde_json::json!([]),
        ];
        // Twice over: a value is never written after what the previous one left in the buffer.
        for value in values.iter().chain(values.iter()) {
            assert_eq!(
                *shared_json(value).unwrap(),
                serde_json::to_vec(value).unwrap()[..]
            );
        }
    }

    #[test]
    fn shared_json_within_a_value_s_own_serialize() {
        assert_eq!(&*shared_json(&Nested(4)).unwrap(), br#""[4,5]""#);
        assert_eq!(&*shared_json(&1u8).unwrap(), b"1");
    }

    #[test]
    fn shared_json_while_its_thread_ends() {
        /// Encodes a value when its thread's locals are dropped, after the buffer's (made later,
        /// dropped first).
        struct AtExit(std::sync::mpsc::Sender<Vec<u8>>);
        impl Drop for AtExit {
            fn drop(&mut self) {
                let _ = self.0.send(shared_json(&[7, 8]).unwrap().to_vec());
            }
        }
        thread_local! {
            static AT_EXIT: RefCell<Option<AtExit>> = const { RefCell::new(None) };
        }
        let (sender, encoded) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            AT_EXIT.with(|at_exit| *at_exit.borrow_mut() = Some(AtExit(sender)));
            assert_eq!(&*shared_json(&1u8).unwrap(), b"1");
        })
        .join()
        .unwrap();
        assert_eq!(encoded.recv().unwrap(), b"[7,8]");
    }

    #[test]
    fn shared_json_after_a_failed_encoding() {
        // A map whose keys are not strings cannot be JSON: the error is returned, half-written bytes
        // are not kept for the next value.
        let bad: std::collections::BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        assert!(shared_json(&bad).is_err());
        assert_eq!(&*shared_json(&[1, 2]).unwrap(), b"[1,2]");
    }

    /// An error type all of whose fields have defaults reads almost any JSON object as itself.
    #[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(default)]
    struct Lenient {
        code: u32,
    }

    impl std::fmt::Display for Lenient {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "code {}", self.code)
        }
    }

    #[test]
    fn each_codec_reads_the_others_records() {
        let exact = ExactErrors::codec(&&Probe::<Lenient>::new());
        let message = MessageErrors::codec(&Probe::<Lenient>::new());
        let by_message = (message.encode)(&Lenient { code: 7 }).unwrap();
        let exactly = (exact.encode)(&Lenient { code: 7 }).unwrap();
        assert_eq!(
            (exact.decode)(&by_message).unwrap(),
            Err("code 7".to_owned())
        );
        assert_eq!((exact.decode)(&exactly).unwrap(), Ok(Lenient { code: 7 }));
        assert_eq!(
            (message.decode)(&by_message).unwrap(),
            Err("code 7".to_owned())
        );
        assert_eq!(
            (message.decode)(&exactly).unwrap(),
            Err(r#"{"code":7}"#.to_owned())
        );
    }
}
