//! Issue 38, defect 1: user code that panics after the body returned — the value's `Serialize`, the
//! error's `Classify` or `Display`, each run by samekey while it records the outcome — must not free
//! the key. The body took effect; the panic unwinds through the call, the task is caught (as a server
//! catches a handler's panic), and the drop guard leaves the call `UNKNOWN` for compensation: a
//! duplicate never runs the body a second time. Each scenario runs on every backend. A value whose
//! JSON holds a `null` has its `Serialize` run twice (the second time looking for a NaN, which JSON
//! would write as `null`): a panic on that second run is one of these panics too.

use crate::support;

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use samekey::{idempotent, Classify, Error, ErrorClass, ReceiptState, Runtime, Store};
use serde::{Serialize, Serializer};
use support::stores::*;
use support::Remote;

/// Where the panic waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PanicIn {
    Serialize,
    /// The second run of the value's `Serialize`.
    SecondSerialize,
    Classify,
    Display,
}

/// A trap that goes off once, on the run it is armed for (none: the default).
#[derive(Debug, Clone, Default)]
struct Trap(Arc<AtomicU32>);

impl Trap {
    fn armed() -> Trap {
        Trap::armed_at(1)
    }

    /// Goes off on its `run`th spring.
    fn armed_at(run: u32) -> Trap {
        Trap(Arc::new(AtomicU32::new(run)))
    }

    fn spring(&self, what: &str) {
        if self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            == Ok(1)
        {
            panic!("{what} panicked (test)");
        }
    }
}

/// The charge's value: its `Serialize` may panic. Its `note` is `None`: its JSON holds a `null`.
#[derive(Debug, Clone, serde::Deserialize)]
struct Charged {
    amount: u64,
    note: Option<String>,
    #[serde(skip)]
    trap: Trap,
}

impl Serialize for Charged {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.trap.spring("Serialize");
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Charged", 2)?;
        st.serialize_field("amount", &self.amount)?;
        st.serialize_field("note", &self.note)?;
        st.end()
    }
}

/// The charge's error: a refusal that stands (after the charge: a later step failed for good), whose
/// `Classify` or `Display` may panic.
#[derive(Debug)]
enum ChargeError {
    Broken(PanicIn, Trap),
    Samekey(Error),
}

impl Classify for ChargeError {
    fn classify(&self) -> ErrorClass {
        match self {
            ChargeError::Broken(on, trap) => {
                if *on == PanicIn::Classify {
                    trap.spring("Classify");
                }
                ErrorClass::Permanent
            }
            ChargeError::Samekey(e) => e.classify(),
        }
    }
}

impl fmt::Display for ChargeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChargeError::Broken(on, trap) => {
                if *on == PanicIn::Display {
                    trap.spring("Display");
                }
                f.write_str("a later step failed")
            }
            ChargeError::Samekey(e) => write!(f, "samekey: {e}"),
        }
    }
}

impl std::error::Error for ChargeError {}

impl From<Error> for ChargeError {
    fn from(e: Error) -> ChargeError {
        ChargeError::Samekey(e)
    }
}

struct Svc {
    rt: Runtime,
    remote: Remote,
    order: String,
}

impl Svc {
    fn on(store: Arc<dyn Store>) -> Arc<Svc> {
        Arc::new(Svc {
            rt: Runtime::builder()
                .node("panics")
                .shared_store(store)
                .build()
                .unwrap(),
            remote: Remote::default(),
            order: format!("o-{:x}", samekey::TraceId::new().as_u128()),
        })
    }

    /// Charges, then hands samekey a value or an error with a panic waiting in it (`armed`).
    #[idempotent(key = "order", scope = "panics.charge", runtime = &self.rt, timeout = "1s",
                 on_unknown = "hold")]
    async fn charge(&self, order: &str, armed: Option<PanicIn>) -> Result<Charged, ChargeError> {
        let amount = self
            .remote
            .call(order, || 500)
            .await
            .map_err(|_| ChargeError::Broken(PanicIn::Classify, Trap::default()))?;
        match armed {
            Some(PanicIn::Serialize) => Ok(Charged {
                amount,
                note: None,
                trap: Trap::armed(),
            }),
            Some(PanicIn::SecondSerialize) => Ok(Charged {
                amount,
                note: None,
                trap: Trap::armed_at(2),
            }),
            Some(on) => Err(ChargeError::Broken(on, Trap::armed())),
            None => Ok(Charged {
                amount,
                note: None,
                trap: Trap::default(),
            }),
        }
    }

    fn key(&self) -> samekey::Key {
        samekey::Key::build("panics.charge", &self.order.as_str())
    }
}

/// The call panics in `on` after its body charged; the task is caught. The key is never given back:
/// it ends `UNKNOWN` (by the drop guard's task), and a duplicate does not charge again.
async fn a_panic_after_the_body_never_frees_the_key(store: Arc<dyn Store>, on: PanicIn) {
    let svc = Svc::on(store);
    let first = tokio::spawn({
        let svc = svc.clone();
        async move { svc.charge(&svc.order, Some(on)).await }
    })
    .await;
    assert!(
        first.as_ref().is_err_and(|e| e.is_panic()),
        "{on:?}: {first:?}"
    );
    assert_eq!(svc.remote.effects(&svc.order), 1);
    let mut state = None;
    for _ in 0..500 {
        state = svc
            .rt
            .store()
            .get(&svc.key(), svc.rt.now_ms())
            .await
            .unwrap()
            .map(|r| r.state);
        if state == Some(ReceiptState::Unknown) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        state,
        Some(ReceiptState::Unknown),
        "{on:?}: the key a panic left is held for compensation"
    );
    let duplicate = svc.charge(&svc.order, None).await;
    assert!(
        matches!(duplicate, Err(ChargeError::Samekey(Error::Unknown { .. }))),
        "{on:?}: {duplicate:?}"
    );
    assert_eq!(
        svc.remote.effects(&svc.order),
        1,
        "{on:?}: the duplicate charged again"
    );
}

async fn a_panic_in_serialize_never_frees_the_key(store: Arc<dyn Store>) {
    a_panic_after_the_body_never_frees_the_key(store, PanicIn::Serialize).await;
}

async fn a_panic_in_a_second_serialize_never_frees_the_key(store: Arc<dyn Store>) {
    a_panic_after_the_body_never_frees_the_key(store, PanicIn::SecondSerialize).await;
}

async fn a_panic_in_classify_never_frees_the_key(store: Arc<dyn Store>) {
    a_panic_after_the_body_never_frees_the_key(store, PanicIn::Classify).await;
}

async fn a_panic_in_display_never_frees_the_key(store: Arc<dyn Store>) {
    a_panic_after_the_body_never_frees_the_key(store, PanicIn::Display).await;
}

support::on_stores!(memory, local_cache, sqlite if "sqlite", postgres if "postgres", mysql if "mysql", redis if "redis" => {
    a_panic_in_serialize_never_frees_the_key,
    a_panic_in_a_second_serialize_never_frees_the_key,
    a_panic_in_classify_never_frees_the_key,
    a_panic_in_display_never_frees_the_key,
});
