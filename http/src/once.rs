//! Work that runs at most once per call (an HTTP handler, a message handler) on samekey's public
//! at-most-once core ([`AtMostOnce`]): the runtime's own claim, replay, fencing, lease kept alive,
//! journal and drop guard.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use samekey_runtime::at_most_once::{AtMostOnce, OnBusy, OnUnknown};
use samekey_runtime::{key::KeyBuilder, Classify, Error, Runtime};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The operation of such work: one attempt, no lookup, no per-attempt timeout (the lease is renewed
/// while the work runs). Leaked: make it once per layer or inbox.
pub(crate) fn operation(
    name: &'static str,
    prefix: &'static str,
    ttl: Duration,
    on_busy: OnBusy,
    on_unknown: OnUnknown,
) -> &'static AtMostOnce {
    AtMostOnce::new("samekey.once")
        .name(name)
        .prefix(prefix)
        .retries(0)
        .backoff(Duration::from_millis(100), Duration::from_secs(1))
        .ttl(ttl)
        .on_busy(on_busy)
        .on_unknown(on_unknown)
        .leak()
}

/// Claims `key` (checking `verify`), runs `work` if the call is the key's first
/// ([`Invocation::run_once`](samekey_runtime::at_most_once::Invocation::run_once)), or answers the
/// recorded outcome; failures are stored by their message.
pub(crate) async fn run<T, E, W, Fut>(
    runtime: Option<&Runtime>,
    op: &'static AtMostOnce,
    key: KeyBuilder,
    verify: KeyBuilder,
    work: W,
) -> Result<T, E>
where
    T: Serialize + DeserializeOwned,
    E: Classify + From<Error> + Display,
    W: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let call = op.with_key(key).verify_with(verify);
    match runtime {
        Some(runtime) => call.runtime(runtime).run_once(work).await,
        None => call.run_once(work).await,
    }
}
