//! A samekey call around work that runs at most once per call (an HTTP handler, a message handler):
//! the runtime's own claim, replay, fencing, journal and drop guard, driven without the attribute.

use std::future::Future;
use std::time::Duration;

use samekey_runtime::__private::{
    begin, Begun, CallError, CallOutput, ErrorCodec, KeyBuilder, OnBusy, OnMissingKey, OnUnknown,
    OperationCell, Spec, Step,
};
use samekey_runtime::{Error, Runtime};

/// The settings of such a call: one attempt, no lookup, no per-attempt timeout (the lease is renewed
/// while the work runs). Leaked: a call's settings are `'static`; make them once per layer or inbox.
pub(crate) fn spec(
    name: &'static str,
    prefix: &'static str,
    ttl: Duration,
    on_busy: OnBusy,
    on_unknown: OnUnknown,
) -> &'static Spec {
    Box::leak(Box::new(Spec {
        scope: "samekey.once",
        scope_given: true,
        operation: OperationCell::new(),
        prefix,
        name,
        retries: 0,
        budget: None,
        metrics: samekey_runtime::__private::MetricsCell::new(),
        backoff_base: Duration::from_millis(100),
        backoff_cap: Duration::from_secs(1),
        jitter: 0.2,
        timeout: None,
        ttl,
        window: None,
        on_busy,
        on_unknown,
        has_lookup: false,
        on_missing_key: OnMissingKey::Error,
    }))
}

/// Claims `key` (checking `verify`), runs `work` if the call is the key's first, or answers the
/// recorded outcome. `work` runs at most once; should the runtime ask for a second attempt (an
/// uncertain first one, with `OnUnknown::Rerun`), `again` runs instead.
pub(crate) async fn run<T, E, W, Fut, A, AFut>(
    runtime: Option<&Runtime>,
    spec: &'static Spec,
    key: KeyBuilder,
    verify: Option<KeyBuilder>,
    codec: ErrorCodec<E>,
    work: W,
    mut again: A,
) -> Result<T, E>
where
    T: CallOutput,
    E: CallError,
    W: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    A: FnMut() -> AFut,
    AFut: Future<Output = Result<T, E>>,
{
    // Generic here: replays decode the stored response each time (no kept copy).
    let mut run = match begin::<Result<T, E>>(runtime, spec, "", key, verify, codec, None) {
        Begun::Run(run) => run,
        Begun::Answered(out) => return out,
    };
    let mut work = Some(work);
    let mut step = run.start().await;
    loop {
        step = match step {
            Step::Done(out) => return out,
            Step::Attempt => match work.take() {
                Some(work) => run.attempt(work()).await,
                None => run.attempt(again()).await,
            },
            Step::Lookup(_) => run.no_lookup().await,
        };
    }
}

/// The `again` of work that cannot run a second time: the call ends as exhausted.
pub(crate) fn exhausted<T, E: From<Error>>(
    call_id: &samekey_runtime::CallId,
) -> impl Future<Output = Result<T, E>> {
    std::future::ready(Err(E::from(Error::Exhausted {
        call_id: call_id.clone(),
        attempts: 1,
    })))
}
