//! Property: under any schedule of faults (lost requests, lost replies, slow replies, 5xx, 4xx, rate
//! limits, hangs, failing lookups), concurrent duplicates and callers that give up mid-call, no key's
//! effect runs twice, and every call that returns ends as a success, a definite failure (nothing took
//! effect), or UNKNOWN in the compensation queue.

mod support;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use samekey::{idempotent, CallId, Error, ReceiptState, Runtime};
use support::{Fault, Remote, TestError};

#[derive(Debug, Clone, Copy)]
enum Policy {
    Lookup,
    Hold,
    Rerun,
}

struct Service {
    rt: Runtime,
    remote: Remote,
}

impl Service {
    #[idempotent(key = "op", runtime = &self.rt, timeout = "1s", retries = 3, backoff = "100ms..1s",
                 lookup = |c| self.remote.status(c))]
    async fn lookup(&self, op: &str, amount: u64) -> Result<u64, TestError> {
        let cx = samekey::current();
        self.remote.charge(cx.call_id(), op, amount).await
    }

    #[idempotent(key = "op", runtime = &self.rt, timeout = "1s", retries = 3, backoff = "100ms..1s",
                 on_unknown = "hold")]
    async fn hold(&self, op: &str, amount: u64) -> Result<u64, TestError> {
        let cx = samekey::current();
        self.remote.charge(cx.call_id(), op, amount).await
    }

    #[idempotent(key = "op", runtime = &self.rt, timeout = "1s", retries = 3, backoff = "100ms..1s",
                 on_unknown = "rerun")]
    async fn rerun(&self, op: &str, amount: u64) -> Result<u64, TestError> {
        let cx = samekey::current();
        self.remote.charge(cx.call_id(), op, amount).await
    }

    async fn call(&self, policy: Policy, op: &str, amount: u64) -> Result<u64, TestError> {
        match policy {
            Policy::Lookup => self.lookup(op, amount).await,
            Policy::Hold => self.hold(op, amount).await,
            Policy::Rerun => self.rerun(op, amount).await,
        }
    }
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        4 => Just(Fault::None),
        1 => Just(Fault::RequestLost),
        1 => Just(Fault::ReplyLost),
        1 => (0u64..3_000).prop_map(|ms| Fault::Slow(Duration::from_millis(ms))),
        1 => Just(Fault::Unavailable),
        1 => Just(Fault::Declined),
        1 => (0u64..2_000).prop_map(Fault::RateLimited),
        1 => Just(Fault::Hang),
    ]
}

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        Just(Policy::Lookup),
        Just(Policy::Hold),
        Just(Policy::Rerun)
    ]
}

/// One call: which operation, when it starts (×10 ms), and whether its caller gives up (drops the
/// call) after that many ×100 ms.
type Call = (u8, u8, Option<u8>);

async fn scenario(
    policy: Policy,
    faults: Vec<Fault>,
    lookups: Vec<bool>,
    calls: Vec<Call>,
) -> Result<(), TestCaseError> {
    let remote = match policy {
        // `rerun` is only correct when the remote deduplicates by callId: that is its contract.
        Policy::Rerun => Remote::deduplicating(),
        Policy::Lookup | Policy::Hold => Remote::new(),
    };
    remote.script(faults);
    remote.script_lookups(lookups.into_iter().map(|ok| {
        if ok {
            Ok(())
        } else {
            Err("lookup down".to_owned())
        }
    }));
    let service = Arc::new(Service {
        rt: Runtime::builder().node("prop").build().unwrap(),
        remote,
    });
    let mut set = tokio::task::JoinSet::new();
    for (op, delay, give_up) in calls {
        let service = service.clone();
        set.spawn(async move {
            tokio::time::sleep(Duration::from_millis(u64::from(delay) * 10)).await;
            let op = format!("op-{}", op % 3);
            let call = service.call(policy, &op, 100);
            let out = match give_up {
                None => Some(call.await),
                Some(after) => {
                    tokio::time::timeout(Duration::from_millis(u64::from(after) * 100), call)
                        .await
                        .ok()
                }
            };
            (op, out)
        });
    }
    let mut outcomes = Vec::new();
    let mut cancelled = Vec::new();
    while let Some(joined) = set.join_next().await {
        match joined.expect("task") {
            (op, Some(out)) => outcomes.push((op, out)),
            (op, None) => cancelled.push(op),
        }
    }
    // Let the drop guards of cancelled calls and the remote's slow executions finish.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let queue: Vec<CallId> = service
        .rt
        .compensations()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.call_id)
        .collect();
    for op in ["op-0", "op-1", "op-2"] {
        let executions = service.remote.executions(op);
        prop_assert!(executions <= 1, "{op} ran {executions} times");
        let mine: Vec<&Result<u64, TestError>> = outcomes
            .iter()
            .filter(|(o, _)| o == op)
            .map(|(_, out)| out)
            .collect();
        let uncertain = mine
            .iter()
            .any(|out| matches!(out, Err(TestError::Samekey(Error::Unknown { .. }))));
        let succeeded = mine.iter().any(|out| out.is_ok());
        let abandoned = cancelled.iter().any(|o| o == op);
        if !uncertain && !succeeded && !abandoned {
            prop_assert_eq!(executions, 0, "{} failed definitely yet ran", op);
        }
        if succeeded {
            prop_assert_eq!(executions, 1, "{} succeeded without running", op);
        }
    }
    for (_, out) in &outcomes {
        match out {
            Ok(amount) => prop_assert_eq!(*amount, 100),
            Err(TestError::Declined | TestError::Refused | TestError::RateLimited { .. }) => {}
            // Nothing ran: every attempt refused, or no place in a rate limit freed up in time.
            Err(TestError::Samekey(Error::Exhausted { .. } | Error::Overloaded { .. })) => {}
            Err(TestError::Samekey(Error::Unknown { call_id })) => {
                let receipt = service.rt.receipt(call_id).await.unwrap();
                let state = receipt.map(|r| r.state);
                let resolved_later =
                    matches!(state, Some(ReceiptState::Success | ReceiptState::Failed));
                prop_assert!(
                    (state == Some(ReceiptState::Unknown) && queue.contains(call_id))
                        || resolved_later,
                    "unknown call {} is neither queued nor resolved: {:?}",
                    call_id,
                    state
                );
            }
            Err(other) => prop_assert!(false, "unexpected outcome {other:?}"),
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn no_effect_runs_twice_and_nothing_is_lost(
        policy in policy(),
        faults in proptest::collection::vec(fault(), 0..12),
        lookups in proptest::collection::vec(proptest::bool::weighted(0.8), 0..6),
        calls in proptest::collection::vec(
            (0u8..3, 0u8..50, proptest::option::weighted(0.2, 0u8..40)),
            1..8,
        ),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(scenario(policy, faults, lookups, calls))?;
    }
}
