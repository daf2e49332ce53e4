//! A scripted remote side for the behaviour tests: a payment-like service that executes, deduplicates
//! nothing by itself (so a second execution is visible), keeps receipts by callId and answers lookups.
#![allow(dead_code)]

pub mod faulty;
pub mod race;
pub mod stores;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use samekey::{CallId, Classify, ErrorClass, RemoteStatus};
use serde::{Deserialize, Serialize};

/// The error type of the functions under test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum TestError {
    #[error("declined")]
    Declined,
    #[error("rejected; nothing took effect")]
    Rejected,
    #[error("refused before processing")]
    Refused,
    #[error("rate limited")]
    RateLimited { retry_after_ms: u64 },
    #[error("connection reset after sending")]
    Reset,
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for TestError {
    fn classify(&self) -> ErrorClass {
        match self {
            TestError::Declined => ErrorClass::Permanent,
            TestError::Rejected => ErrorClass::Rejected,
            TestError::Refused => ErrorClass::Retryable,
            TestError::RateLimited { retry_after_ms } => ErrorClass::RateLimited {
                retry_after: Some(Duration::from_millis(*retry_after_ms)),
            },
            TestError::Reset => ErrorClass::Unknown,
            TestError::Samekey(e) => e.classify(),
        }
    }
}

/// What the remote does with the next request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// Executes and answers.
    None,
    /// The request never arrives: nothing executes; the client sees a reset.
    RequestLost,
    /// Executes, but the reply is lost: the client sees a reset.
    ReplyLost,
    /// Executes after this delay, whatever the client does meanwhile.
    Slow(Duration),
    /// Refuses before processing (503).
    Unavailable,
    /// Rejects the request for good (4xx); recorded as a failed receipt.
    Declined,
    /// Rejects the request and changes nothing (a declined card): the caller may try again.
    Rejected,
    /// Rate limited; retry after this many ms.
    RateLimited(u64),
    /// Never answers, never executes.
    Hang,
}

#[derive(Default)]
struct State {
    script: VecDeque<Fault>,
    receipts: HashMap<String, RemoteStatus<u64, TestError>>,
    executions: HashMap<String, u32>,
    seen: Vec<String>,
    lookups: u32,
    lookup_script: VecDeque<Result<(), String>>,
    dedup: bool,
}

/// The remote side. Keyed by the business key the caller passes, so double executions of one
/// operation are counted whatever callIds they carry.
#[derive(Clone, Default)]
pub struct Remote {
    state: Arc<Mutex<State>>,
}

impl Remote {
    pub fn new() -> Remote {
        Remote::default()
    }

    /// A remote that deduplicates by callId (what `on_unknown = "rerun"` relies on): a request whose
    /// callId already took effect answers the stored result without executing again.
    pub fn deduplicating() -> Remote {
        let remote = Remote::default();
        remote.state.lock().unwrap().dedup = true;
        remote
    }

    /// Faults for the next requests, in order; after them, requests succeed.
    pub fn script(&self, faults: impl IntoIterator<Item = Fault>) {
        self.state.lock().unwrap().script.extend(faults);
    }

    /// Answers for the next lookups: `Err` makes that lookup itself fail.
    pub fn script_lookups(&self, answers: impl IntoIterator<Item = Result<(), String>>) {
        self.state.lock().unwrap().lookup_script.extend(answers);
    }

    /// How many times the operation `op` took effect.
    pub fn executions(&self, op: &str) -> u32 {
        self.state
            .lock()
            .unwrap()
            .executions
            .get(op)
            .copied()
            .unwrap_or(0)
    }

    /// The callIds of every request that reached the wire, in order.
    pub fn seen(&self) -> Vec<String> {
        self.state.lock().unwrap().seen.clone()
    }

    pub fn lookups(&self) -> u32 {
        self.state.lock().unwrap().lookups
    }

    fn execute(state: &Arc<Mutex<State>>, call_id: &str, op: &str, amount: u64) {
        let mut s = state.lock().unwrap();
        *s.executions.entry(op.to_owned()).or_default() += 1;
        s.receipts
            .insert(call_id.to_owned(), RemoteStatus::Succeeded(amount));
    }

    /// Charges `amount` for operation `op` under `call_id`.
    pub async fn charge(&self, call_id: &CallId, op: &str, amount: u64) -> Result<u64, TestError> {
        let id = call_id.to_string();
        let fault = {
            let mut s = self.state.lock().unwrap();
            s.seen.push(id.clone());
            if s.dedup {
                match s.receipts.get(&id) {
                    Some(RemoteStatus::Succeeded(v)) => return Ok(*v),
                    Some(RemoteStatus::Failed(e)) => return Err(e.clone()),
                    // Still running under this callId: answer "in progress", which is not an outcome.
                    Some(RemoteStatus::Processing) => return Err(TestError::Reset),
                    Some(RemoteStatus::NotReceived) | None => {}
                }
            }
            s.script.pop_front().unwrap_or(Fault::None)
        };
        match fault {
            Fault::None => {
                Self::execute(&self.state, &id, op, amount);
                Ok(amount)
            }
            Fault::RequestLost => Err(TestError::Reset),
            Fault::ReplyLost => {
                Self::execute(&self.state, &id, op, amount);
                Err(TestError::Reset)
            }
            Fault::Slow(delay) => {
                self.state
                    .lock()
                    .unwrap()
                    .receipts
                    .insert(id.clone(), RemoteStatus::Processing);
                let (state, op2) = (self.state.clone(), op.to_owned());
                let server = tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    Remote::execute(&state, &id, &op2, amount);
                });
                let _ = server.await;
                Ok(amount)
            }
            Fault::Unavailable => Err(TestError::Refused),
            Fault::Declined => {
                self.state
                    .lock()
                    .unwrap()
                    .receipts
                    .insert(id, RemoteStatus::Failed(TestError::Declined));
                Err(TestError::Declined)
            }
            Fault::Rejected => Err(TestError::Rejected),
            Fault::RateLimited(ms) => Err(TestError::RateLimited { retry_after_ms: ms }),
            Fault::Hang => std::future::pending().await,
        }
    }

    /// The receipt of `call_id` on the remote side.
    pub async fn status(&self, call_id: &CallId) -> Result<RemoteStatus<u64, TestError>, String> {
        let mut s = self.state.lock().unwrap();
        s.lookups += 1;
        if let Some(Err(e)) = s.lookup_script.pop_front() {
            return Err(e);
        }
        Ok(s.receipts
            .get(&call_id.to_string())
            .cloned()
            .unwrap_or(RemoteStatus::NotReceived))
    }
}

/// A clock that a test moves by hand, on top of the system clock: leases and TTLs of the stores that
/// take the caller's time (memory, SQLite) can be passed without waiting, in real time (which stores
/// that do I/O need: tokio's paused time would fire their pool timeouts); and a node can be made to run
/// ahead of or behind the others.
#[derive(Clone, Default)]
pub struct TestClock {
    base: samekey::SystemClock,
    offset_ms: Arc<std::sync::atomic::AtomicI64>,
}

impl TestClock {
    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.offset_ms.fetch_add(
            i64::try_from(by.as_millis()).unwrap(),
            std::sync::atomic::Ordering::SeqCst,
        );
    }

    /// A clock that runs `by` behind the system clock.
    pub fn behind(by: Duration) -> TestClock {
        let clock = TestClock::default();
        clock.offset_ms.store(
            -i64::try_from(by.as_millis()).unwrap(),
            std::sync::atomic::Ordering::SeqCst,
        );
        clock
    }
}

impl samekey::Clock for TestClock {
    fn now_ms(&self) -> u64 {
        let offset = self.offset_ms.load(std::sync::atomic::Ordering::SeqCst);
        self.base.now_ms().saturating_add_signed(offset)
    }
}

/// Runs each scenario on each listed store, as a test of its own: `on_stores!(memory, sqlite if
/// "sqlite" => { scenario_a, scenario_b })`. Each store is an `async fn NAME() -> Option<Arc<dyn
/// Store>>` beside the scenarios (`None`: its server is not configured, and it said so), compiled with
/// the cargo feature named after `if`; each scenario an `async fn(Arc<dyn Store>)`.
#[allow(unused_macros)]
macro_rules! on_stores {
    ($($store:ident $(if $feature:literal)?),* => $scenarios:tt) => {
        $(
            $(#[cfg(feature = $feature)])?
            mod $store {
                $crate::support::on_stores!(@each $store $scenarios);
            }
        )*
    };
    (@each $store:ident { $($scenario:ident),* $(,)? }) => {
        $(
            #[tokio::test]
            async fn $scenario() {
                if let Some(store) = super::$store().await {
                    super::$scenario(store).await;
                }
            }
        )*
    };
}
#[allow(unused_imports)]
pub(crate) use on_stores;
