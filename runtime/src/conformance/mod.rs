//! The store conformance suite, written once and run against every backend: each function checks one
//! clause of the [`Store`] contract and panics (it is a test) when the store breaks it.
//!
//! A backend's test file runs the whole suite with one line; the expression makes a fresh store for each
//! test (it may share a database: every check uses keys and callIds of its own):
//!
//! ```text
//! samekey_runtime::store_conformance_tests!(std::sync::Arc::new(samekey_runtime::MemoryStore::new()));
//! ```
//!
//! The checks follow the four contracts of the [`Store`] trait, a file each: receipts (claims, fences,
//! completion, transitions, release and forget, take-over, leases, expiry, waiting), the compensation
//! queue, the journal, and listings. Every check is public here, by name, for a suite that runs them
//! its own way. Feature `conformance`.
//!
//! [`Store`]: crate::Store

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::{Mutex, PoisonError};

mod journal;
mod listings;
mod queue;
mod receipts;
mod support;

pub use journal::{
    journal_is_kept_in_order, journal_lives_with_its_record, journaled_keys_are_listed,
};
pub use listings::{orphans_are_listed, receipts_are_listed, receipts_are_paged};
pub use queue::compensation_queue;
pub use receipts::{
    callback_transitions, claim_is_exclusive, claim_records_processing,
    complete_is_fenced_and_reentrant, extend_lease_is_fenced, fences_grow,
    forget_frees_a_finished_key, receipts_are_found_by_call_ids, release_frees_the_key,
    reopen_corrects_a_finished_record, take_over_is_exclusive_and_fences_out, take_over_rules,
    ttl_expiry, unknown_moves_forward, wait_settled_wakes, wait_settled_wakes_on_release,
};
pub use support::{PURGE_T0, T0};

/// Says that a suite did not run, and why: prints `skipped: {reason}` on standard error, once per reason
/// in a test process. It writes past the test harness's output capture (which hides a passing test's
/// `println!`), so that a plain `cargo test` shows what it did not test. Suites that need a server call
/// it when the server's URL is not set.
pub fn skipped(reason: &str) {
    static SAID: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let mut said = SAID.lock().unwrap_or_else(PoisonError::into_inner);
    if said.insert(reason.to_owned()) {
        // Nothing to do if standard error is gone.
        let _ = writeln!(std::io::stderr().lock(), "skipped: {reason}");
    }
}

/// Generates one `#[tokio::test]` per conformance check, each on a store made by `$make` (an
/// expression of type `Arc<S>` for a `Store` `S`). With `optional:`, the expression gives an `Option`, and
/// `None` (no server configured) makes each test print why it was skipped and pass.
#[macro_export]
macro_rules! store_conformance_tests {
    (optional: $make:expr) => {
        $crate::store_conformance_tests!(@all $make;);
    };
    ($make:expr) => {
        $crate::store_conformance_tests!(@all ::core::option::Option::Some($make););
    };
    (@all $make:expr;) => {
        $crate::store_conformance_tests!(@tests $make;
            claim_is_exclusive claim_records_processing fences_grow complete_is_fenced_and_reentrant
            callback_transitions unknown_moves_forward release_frees_the_key forget_frees_a_finished_key reopen_corrects_a_finished_record receipts_are_found_by_call_ids
            take_over_rules extend_lease_is_fenced
            ttl_expiry wait_settled_wakes compensation_queue take_over_is_exclusive_and_fences_out
            wait_settled_wakes_on_release orphans_are_listed receipts_are_listed
            journal_is_kept_in_order journal_lives_with_its_record journaled_keys_are_listed receipts_are_paged);
    };
    (@tests $make:expr; $($check:ident)+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let made = $make;
                let ::core::option::Option::Some(made) = made else {
                    return;
                };
                let store: ::std::sync::Arc<dyn $crate::Store> = made;
                $crate::conformance::$check(store).await;
            }
        )+
    };
}
