//! What the behaviour tests share: the error type of the functions under test, the test kit's remote
//! side with it, a clock moved by hand, and the stores to run on.
#![allow(dead_code)]

pub mod faulty;
pub mod race;
pub mod stores;

use std::sync::Arc;
use std::time::Duration;

#[allow(unused_imports)]
pub use samekey::testing::Fault;
use samekey::testing::RemoteError;
use samekey::{Classify, ErrorClass};
use serde::{Deserialize, Serialize};

/// The error type of the functions under test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum TestError {
    #[error("rejected for good")]
    Rejected,
    #[error("declined; nothing took effect")]
    Declined,
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
            TestError::Rejected => ErrorClass::Permanent,
            TestError::Declined => ErrorClass::Rejected,
            TestError::Refused => ErrorClass::Retryable,
            TestError::RateLimited { retry_after_ms } => ErrorClass::RateLimited {
                retry_after: Some(Duration::from_millis(*retry_after_ms)),
            },
            TestError::Reset => ErrorClass::Unknown,
            TestError::Samekey(e) => e.classify(),
        }
    }
}

/// Yields until `count` (a counter that something spawned bumps when it starts) is above zero.
pub async fn until_started(count: &std::sync::atomic::AtomicU32) {
    while count.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
}

/// What the test kit's remote answers, as the functions under test see it.
impl From<RemoteError> for TestError {
    fn from(e: RemoteError) -> TestError {
        match e {
            RemoteError::TimedOut => TestError::Reset,
            RemoteError::Unavailable => TestError::Refused,
            RemoteError::RateLimited { retry_after_ms } => {
                TestError::RateLimited { retry_after_ms }
            }
            RemoteError::Rejected => TestError::Rejected,
            RemoteError::Declined => TestError::Declined,
        }
    }
}

/// The remote side of the behaviour tests: the test kit's, charging amounts. It executes every
/// request that arrives (so a second execution of one order is visible), keeps outcomes by callId and
/// answers lookups.
pub type Remote = samekey::testing::Remote<u64, TestError>;

/// A clock that a test moves by hand, on top of the system clock: leases and TTLs of the stores that
/// take the caller's time (memory, SQLite) can be passed without waiting, in real time (which stores
/// that do I/O need: tokio's paused time would fire their pool timeouts); and a node can be made to run
/// ahead of or behind the others.
#[derive(Clone, Default)]
pub struct TestClock {
    base: samekey::clock::SystemClock,
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

impl samekey::clock::Clock for TestClock {
    fn now_ms(&self) -> u64 {
        let offset = self.offset_ms.load(std::sync::atomic::Ordering::SeqCst);
        self.base.now_ms().saturating_add_signed(offset)
    }
}

/// Runs each scenario on each listed store, as a test of its own: `on_stores!(memory, sqlite if
/// "sqlite", mysql_cached if "mysql" & "redis" => { scenario_a, scenario_b })`. Each store is an
/// `async fn NAME() -> Option<Arc<dyn Store>>` beside the scenarios (`None`: its server is not
/// configured, and it said so), compiled with the cargo features named after `if`; each scenario an
/// `async fn(Arc<dyn Store>)`.
#[allow(unused_macros)]
macro_rules! on_stores {
    ($($store:ident $(if $($feature:literal)&+)?),* => $scenarios:tt) => {
        $(
            $(#[cfg(all($(feature = $feature),+))])?
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
