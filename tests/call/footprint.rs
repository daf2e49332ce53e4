//! What an `#[idempotent]` call costs in memory while it is in flight: its future. A service holds one
//! per call in flight (in a task, or inside the caller's own future, which it moves whole), so the
//! paths after a failed attempt — retries, lookups, compensation, a record held by another caller —
//! are boxed where they are taken, and the future is as large as a first success needs.

use crate::support;

use samekey::{idempotent, Runtime};
use support::TestError;

struct Service {
    rt: Runtime,
}

impl Service {
    #[idempotent(key = "order", runtime = &self.rt)]
    async fn charge(&self, order: u64, amount: u64) -> Result<u64, TestError> {
        Ok(order + amount)
    }

    #[idempotent(key = "order", runtime = &self.rt, timeout = "1s", lookup = |_c| async {
        Ok::<_, String>(samekey::RemoteStatus::<u64, TestError>::NotReceived)
    })]
    async fn charge_with_lookup(&self, order: u64, amount: u64) -> Result<u64, TestError> {
        Ok(order + amount)
    }
}

#[test]
fn a_call_in_flight_holds_less_than_two_kibibytes() {
    let service = Service { rt: Runtime::new() };
    // 3 168 bytes each before the slow paths were boxed, 1 680 after (this test fails on the former),
    // 1 632 since `Run::start` and `Run::attempt` hand out the call's own futures.
    // 1 664 with every feature, since a taken-over call's look for a contradiction is boxed.
    let plain = std::mem::size_of_val(&service.charge(1, 2));
    let with_lookup = std::mem::size_of_val(&service.charge_with_lookup(1, 2));
    println!("a call's future: {plain} bytes, {with_lookup} with a lookup");
    assert!(plain <= 2048, "a call's future is {plain} bytes");
    assert!(
        with_lookup <= 2048,
        "a call's future with a lookup is {with_lookup} bytes"
    );
}
