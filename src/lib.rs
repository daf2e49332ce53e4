//! # samekey — make remote calls safe to retry
//!
//! A timeout does not say whether the other side acted. Retrying with a new id turns it into a double
//! charge; giving up turns it into a lost order. `samekey` puts one attribute on an `async fn`:
//!
//! ```
//! use samekey::{idempotent, Classify, ErrorClass};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug, Serialize, Deserialize)]
//! enum PayError { Declined, Unavailable, Samekey(samekey::Error) }
//!
//! impl Classify for PayError {
//!     fn classify(&self) -> ErrorClass {
//!         match self {
//!             PayError::Declined => ErrorClass::Permanent,
//!             PayError::Unavailable => ErrorClass::Retryable,
//!             PayError::Samekey(e) => e.classify(),
//!         }
//!     }
//! }
//! impl From<samekey::Error> for PayError {
//!     fn from(e: samekey::Error) -> Self { PayError::Samekey(e) }
//! }
//!
//! #[idempotent(key = "order_id + op", retries = 3)]
//! async fn charge(order_id: &str, op: &str, amount: u64) -> Result<u64, PayError> {
//!     let call = samekey::current();   // the same callId on every attempt
//!     let _ = call.call_id();
//!     Ok(amount)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! assert_eq!(charge("o-1", "charge", 500).await.unwrap(), 500);
//! // A duplicate gets the stored first result; the body does not run again.
//! assert_eq!(charge("o-1", "charge", 500).await.unwrap(), 500);
//! # }
//! ```
//!
//! The attribute computes the idempotency key (from business inputs only — volatile inputs are
//! rejected at compile time) and the callId once, claims the key in a [`Store`], replays the stored
//! first outcome to duplicates, retries only what [`Classify`] calls retryable (exponential backoff with
//! jitter, same callId), treats a timeout as *unknown* and asks the receipt (`lookup`) before anything
//! else, and hands what stays undecided to the compensation queue as [`Error::Unknown`].
//!
//! # Where to read on
//!
//! * [`idempotent`]: the attribute's reference — arguments, keys and scopes, the function's types, the
//!   decision table (what a call does), `lookup`, which runtime, replays, tracing events.
//! * [`guide`]: one page per topic — [errors](guide::errors) (which class when, what samekey
//!   answers), [keys](guide::keys), [stores](store), [limits] (retry budgets,
//!   rate limits), [compensation], [callbacks](callback),
//!   [metrics](guide::metrics), [testing](guide::testing), [HTTP](guide::http), [gRPC](guide::grpc), [messages](guide::messaging),
//!   [compile-time errors](guide::compile_errors), and [the rules](guide::rules) samekey keeps (the
//!   decision table, what the macro generates, the field lessons).
//! * [`Runtime`]: the store, node name, clock and limits calls use; [`Runtime::scope`] for tests;
//!   [`Runtime::stats`], [`Runtime::receipt`] and [`Runtime::compensations`] to see what happened.
//! * [`journal`]: a call's timeline; [`reconcile`]: a day's receipts against the counterparty's.
//! * [`at_most_once`]: the same guarantees without the attribute, for layers and consumers.
//! * [`observe::observed`]: whether a call was a replay, and its callId.
//! * [`store`]: the [`Store`] contract and the backends; `conformance` (feature `conformance`) for your own.
//! * [`KeyPart`]: what may be part of a key.
//!
//! The operator's side — the `samekey` command, "it ran twice", "it says unknown" — is the runbook in
//! the repository's `cli/README.md`; measured costs are in its `BENCHMARKS.md`.
//!
//! # Features
//!
//! | feature | adds |
//! |---|---|
//! | `sqlite` | [`store::SqliteStore`]: one file, durable across restarts |
//! | `postgres` | [`store::PgStore`]: many instances, receipts in your transaction |
//! | `mysql` | [`store::MySqlStore`]: MySQL 8 or MariaDB 10.6+, many instances, receipts in your transaction |
//! | `redis` | [`store::RedisStore`] (one server or a cluster) and [`store::CachedStore`] |
//! | `uuid` | `uuid::Uuid` as a key part |
//! | `chrono` | `chrono::NaiveDate` as a key part |
//! | `json` | `serde_json::Value` as a key part (canonical; floats refused) |
//! | `metrics` | counters and histograms through the `metrics` facade ([guide](guide::metrics)) |
//! | `testing` | the test kit, `samekey::testing` ([guide](guide::testing)) |
//! | `conformance` | the store conformance suite, `samekey::conformance` and `store_conformance_tests!`, for a store of your own |
//! | `csv` | `reconcile::read_csv`, the counterparty's records from a CSV file |
//! | `opentelemetry` | [`context::parent_span`] parents an integration's `samekey` span to the active OpenTelemetry span (else the inbound `traceparent`), and [`context::Context::traceparent`] names the active span (`tracing-opentelemetry`) |

#![warn(missing_docs)]

#[doc = include_str!("idempotent.md")]
pub use samekey_macros::idempotent;
/// On an `impl` block: the default scope of every `#[idempotent]` method in it names the block's self
/// type as written (`my_app::billing::Stripe::charge` instead of `my_app::billing::charge`).
///
/// A default scope is the module path and the function's name, so same-named methods of two `impl`
/// blocks in one module would share one scope, and each other's keys. samekey refuses that at the
/// second operation's first call ([`Error::ScopeClash`], before anything runs); `#[scoped]` gives each
/// block's methods a scope of their own. A method with `scope = "..."` keeps its own.
///
/// ```
/// # use samekey::{idempotent, scoped, Classify, ErrorClass};
/// # #[derive(Debug, serde::Serialize, serde::Deserialize)]
/// # struct PayError(String);
/// # impl Classify for PayError { fn classify(&self) -> ErrorClass { ErrorClass::Permanent } }
/// # impl From<samekey::Error> for PayError { fn from(e: samekey::Error) -> Self { PayError(e.to_string()) } }
/// struct Stripe;
/// struct Paypal;
///
/// #[scoped]
/// impl Stripe {
///     #[idempotent(key = "order_id")]
///     async fn charge(&self, order_id: u64) -> Result<String, PayError> {
///         Ok(format!("stripe-{order_id}"))
///     }
/// }
///
/// #[scoped]
/// impl Paypal {
///     #[idempotent(key = "order_id")]
///     async fn charge(&self, order_id: u64) -> Result<String, PayError> {
///         Ok(format!("paypal-{order_id}"))
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// assert_eq!(Stripe.charge(9).await.unwrap(), "stripe-9");
/// assert_eq!(Paypal.charge(9).await.unwrap(), "paypal-9"); // not Stripe's receipt
/// # }
/// ```
pub use samekey_macros::scoped;
/// Derives [`KeyPart`] for a struct or an enum: fields in declaration order, enum variants by name.
/// `#[key_part(skip)]` leaves a field out.
pub use samekey_macros::KeyPart;

// One list of names, the runtime's: the everyday names at the root, everything else in its module
// (`CHANGELOG.md` lists the moves), and with their features the `sqlx` and `redis` crates the stores
// take. The modules below are named again only to carry a guide page.
pub use samekey_runtime::*;

#[doc = include_str!("../docs/stores.md")]
pub use samekey_runtime::store;

#[doc = include_str!("../docs/limits.md")]
pub use samekey_runtime::limits;

#[doc = include_str!("../docs/compensation.md")]
pub use samekey_runtime::compensation;

#[doc = include_str!("../docs/callbacks.md")]
pub use samekey_runtime::callback;

#[doc = include_str!("../docs/journal.md")]
pub use samekey_runtime::journal;

#[doc = include_str!("../docs/reconcile.md")]
pub use samekey_runtime::reconcile;

/// Guides: one page per topic, with examples that run as doctests. Docs only: no code.
///
/// The attribute's own reference is [`idempotent`]; these pages cover what is around
/// it. Pages about one module open that module's documentation instead: [`store`], [`limits`],
/// [`compensation`], [`callback`], [`journal`], [`reconcile`].
pub mod guide {
    #[doc = include_str!("../docs/errors.md")]
    pub mod errors {}
    #[doc = include_str!("../docs/keys.md")]
    pub mod keys {}
    #[doc = include_str!("../docs/metrics.md")]
    pub mod metrics {}
    #[doc = include_str!("../docs/testing.md")]
    pub mod testing {}
    #[doc = include_str!("../docs/http.md")]
    pub mod http {}
    #[doc = include_str!("../docs/grpc.md")]
    pub mod grpc {}
    #[doc = include_str!("../docs/messaging.md")]
    pub mod messaging {}
    #[doc = include_str!("../docs/compile_errors.md")]
    pub mod compile_errors {}
    #[doc = include_str!("../docs/rules.md")]
    pub mod rules {}
}

#[cfg(feature = "testing")]
pub mod testing {
    #![doc = include_str!("testing.md")]
    pub use samekey_runtime::testing::*;
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// What the code generated by `#[idempotent]` uses. Not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use samekey_runtime::__private::*;
}
