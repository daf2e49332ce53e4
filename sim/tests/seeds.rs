//! The seeds the simulation runs in every `cargo test`: a range with every fault but the held-back
//! ones, and the seeds that found the defects known and not yet fixed — which must go on finding them
//! until the fix lands (then the seed moves to the regressions below, and its fault leaves
//! `HELD_BACK`).

use samekey_sim::{held_back, run_with, Options, Report};

fn seeds_from_env(default_from: u64, default_count: u64) -> std::ops::Range<u64> {
    let get = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let from = get("SAMEKEY_SIM_FROM", default_from);
    from..from + get("SAMEKEY_SIM_SEEDS", default_count)
}

fn failure(report: &Report) -> String {
    let mut out = format!("seed {} broke the promise:\n", report.seed);
    for v in &report.violations {
        out.push_str(&format!("  {v}\n"));
    }
    out.push_str(&report.shortened);
    out.push_str(&format!("replay: {}\n", report.replay_command()));
    out
}

/// Every seed of the range keeps every invariant, faults held back aside.
#[test]
fn a_range_of_seeds_keeps_the_promise() {
    let options = Options {
        without: held_back(),
    };
    let mut failed = Vec::new();
    for seed in seeds_from_env(0, 300) {
        let report = run_with(seed, &options).expect("a runtime");
        if !report.passed() {
            failed.push(failure(&report));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The defects the simulation found on its own, on the code as it stands, each replayed as a person
/// replays a seed (`samekey-sim --seed N --without …`, a process of its own) with a part of the
/// violation it reports. Each of these tests fails once its defect is fixed: move the seed to the
/// regressions, and its fault out of `HELD_BACK`.
fn finds(seed: u64, without: &str, expected: &str) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_samekey-sim"));
    command.args(["--seed", &seed.to_string()]);
    if !without.is_empty() {
        command.args(["--without", without]);
    }
    let out = command.output().expect("the samekey-sim binary runs");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains(expected),
        "seed {seed} no longer finds {expected:?}: was the defect fixed? Then move it to the \
         regressions. It printed:\n{printed}"
    );
    assert!(printed.contains(&format!(
        "replay: cargo run -p samekey-sim -- --seed {seed}"
    )));
}

/// Issue 38, defect 1: `Display` panics after the gateway charged; the key is given back and the
/// customer's next try charges again.
#[test]
fn finds_a_panic_in_user_code_after_the_effect_freeing_the_key() {
    finds(
        1,
        "",
        "invariant 1 [o7]: charged 2 times: #8 under c9, #12 under c13",
    );
}

/// Issue 38, defect 2: the reversal's release acted and its answer was lost; the call goes back to
/// `UNKNOWN`, the customer's retry takes it over, hears "not received" and charges.
#[test]
fn finds_a_reversal_that_failed_taken_for_nothing_ran() {
    finds(
        5449,
        "PanicBody,PanicSerialize,PanicClassify,PanicDisplay",
        "stock released (reversal c10) beside charge #7 under c6",
    );
}

/// Found by the simulation: the worker's escalation reached the store and its answer was lost; the
/// entry is `MANUAL` and the escalation hook is never called, so no person hears of it.
#[test]
fn finds_an_escalation_that_never_reaches_the_hook() {
    finds(
        29017,
        "PanicBody,PanicSerialize,PanicClassify,PanicDisplay,ReplyLost@Compensation",
        "c6 is MANUAL but the escalation hook was never called",
    );
}
