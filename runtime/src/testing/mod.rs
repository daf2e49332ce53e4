//! A test kit for your own `#[idempotent]` functions: a deterministic runtime, a fault-injecting
//! remote side, and assertions that read like the guarantee. Feature `testing`; see the `samekey`
//! crate's `testing` module for the guide and a complete test.

mod fault;
mod kit;
mod remote;
mod scope;

pub use fault::{faults, schedules, Fault, FaultMix, Schedule};
pub use kit::{TestKit, Told, ToldOutcome};
pub use remote::{Delivery, Remote, RemoteError};
