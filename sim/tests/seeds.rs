//! The seeds the simulation runs in every `cargo test`: a range with every fault but the held-back
//! ones, and the seeds that found the defects known and not yet fixed — which must go on finding them
//! until the fix lands (then its test becomes a regression — the same seed, keeping the promise — and
//! its fault leaves `HELD_BACK`).

use samekey_sim::{held_back, run_with, Options, Report};

fn seeds_from_env(default_from: u64, default_count: u64) -> std::ops::Range<u64> {
    let get = |name: &str, default: u64| match std::env::var(name) {
        Err(_) => default,
        Ok(v) => v
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v:?} is not a number of seeds: {e}")),
    };
    let from = get("SAMEKEY_SIM_FROM", default_from);
    from..from.saturating_add(get("SAMEKEY_SIM_SEEDS", default_count))
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
/// violation it reports. Each of these tests fails once its defect is fixed: turn it into a
/// regression (the same seed and faults, asserting the promise kept), and its fault out of
/// `HELD_BACK`.
fn finds(seed: u64, without: &str, expected: &str) {
    let (_, printed) = replay(seed, without);
    assert!(
        printed.contains(expected),
        "seed {seed} no longer finds {expected:?}: was the defect fixed? Then make this test \
         a regression. It printed:\n{printed}"
    );
    assert!(printed.contains(&format!(
        "replay: cargo run -p samekey-sim -- --seed {seed}"
    )));
}

/// A regression: `seed`, replayed as a person replays it, keeps every invariant.
fn keeps(seed: u64, without: &str) {
    let (passed, printed) = replay(seed, without);
    assert!(
        passed && printed.contains("1 passed, 0 failed"),
        "seed {seed} breaks the promise again:\n{printed}"
    );
}

/// Replays `seed` without the faults `without` (`samekey-sim --seed N --without …`, a process of its
/// own): whether it passed, and what it printed.
fn replay(seed: u64, without: &str) -> (bool, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_samekey-sim"));
    command.args(["--seed", &seed.to_string()]);
    if !without.is_empty() {
        command.args(["--without", without]);
    }
    let out = command.output().expect("the samekey-sim binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Every held-back fault but `kept`, as a list for `--without`: to replay one finding with its own
/// fault and none of the others'.
fn all_held_back_but(kept: &[&str]) -> String {
    samekey_sim::HELD_BACK
        .iter()
        .map(|(fault, _)| *fault)
        .filter(|f| !kept.contains(f))
        .collect::<Vec<_>>()
        .join(",")
}

/// Issue 38, defect 1, fixed: user code panicked after the gateway charged (here the value's
/// `Serialize`, as the charge was recorded), the key was given back and the customer's next try
/// charged again. The call now stays `Attempting` until its outcome is written: the panic leaves it
/// `UNKNOWN` for compensation. The seed that found it keeps the promise.
#[test]
fn keeps_the_promise_when_user_code_panics_after_the_effect() {
    keeps(4, &all_held_back_but(&[]));
}

/// Issue 38, defect 2, fixed: the reversal's release acted and its answer was lost; the call went back
/// to `UNKNOWN` as if nothing ran, the customer's retry took it over, heard "not received" and charged
/// beside the released stock. A reversal error classified `Unknown` now keeps the reversal open and
/// goes to a person. The seed that found it keeps the promise.
#[test]
fn keeps_the_promise_when_a_reversal_s_answer_is_lost() {
    keeps(1119, &all_held_back_but(&[]));
}

/// Issue 38, defect 9, fixed: a taker hears "not received" and stalls past its lease; another node
/// takes the call over, asks, charges and records it. The first, awake, confirms under its fence that
/// the key is still its own before it sends, and sends nothing. These seeds found it (a second charge,
/// 2193; a charge beside a `FAILED` record, 1981) and now keep the promise.
#[test]
fn keeps_the_promise_when_a_taker_stalls_after_its_lookup() {
    keeps(2193, &all_held_back_but(&[]));
    keeps(1981, &all_held_back_but(&[]));
}

/// Found by CI's range: a consumer's runtime had its concurrency limit at 1, its place held by a long
/// call; each delivery of a shipping message was refused `Overloaded` before the handler and counted
/// toward `max_deliveries`, and the message was dead-lettered never worked. A refusal of samekey's own
/// before the handler is now deferred, not counted. The seeds that found it keep the promise.
#[test]
fn keeps_the_promise_when_the_consumers_own_limit_refuses_its_deliveries() {
    keeps(1_698_993_650, &all_held_back_but(&[]));
    keeps(1_698_998_912, &all_held_back_but(&[]));
}

/// Issue 38, defect 4, fixed: the worker escalated an entry (here a reversal whose outcome is
/// unknown) and the store's answer to the escalation was lost; the entry was `MANUAL` and the hook
/// that pages a person was never called. The hook now runs when the answer is lost too. The seed
/// that found it keeps the promise.
#[test]
fn keeps_the_promise_when_an_escalation_s_answer_is_lost() {
    keeps(30, &all_held_back_but(&[]));
}

/// Found by a soak of the simulation itself (an invariant stricter than the promise): a message
/// worked once whose downstream replies were lost on every delivery is dead-lettered when its
/// deliveries run out, its call `MANUAL` with the hook called — in its dead-letter place with its
/// reason, not lost.
#[test]
fn keeps_the_promise_when_a_message_worked_once_is_given_up_to_a_person() {
    keeps(2_015_045, &all_held_back_but(&[]));
}

/// Issue 39: the HTTP Idempotency-Key layer gives the key back on a `303 See Other` from a handler
/// that charged (seed 23), on a `502` after the charge (seed 4), and on a `502` after the handler's
/// upstream call lost its reply (seed 13): the client's retry under the same key charges again.
#[test]
fn finds_an_http_answer_that_may_have_run_giving_the_key_back() {
    finds(
        23,
        &all_held_back_but(&["AnsweredRedirect"]),
        "invariant 1 [o5]: charged 2 times: #1 under c4, #2 under c4",
    );
    finds(
        4,
        &all_held_back_but(&["Answered5xx"]),
        "invariant 1 [o9]: charged 2 times: #2 under c5, #5 under c5",
    );
    finds(
        13,
        &all_held_back_but(&["ReplyLost@Http"]),
        "invariant 1 [o5]: charged 2 times: #1 under c1, #5 under c1",
    );
}

/// Issue 39, defect 4: a gRPC handler that charged passes up a nested call's refusal (`ABORTED`,
/// marked unknown) with `?`; the layer gives the key back and the retry charges again.
#[test]
fn finds_a_grpc_nested_refusal_giving_the_key_back() {
    finds(
        20,
        &all_held_back_but(&["NestedRefusal"]),
        "invariant 1 [o7]: charged 2 times: #6 under c14, #7 under c14",
    );
}

/// Issue 39, defects 1 and 2: a gRPC reply too large to store is stored as `UNIMPLEMENTED`; a
/// duplicate replays it, its client takes it for "nothing ran", and the charge is recorded failed.
#[test]
fn finds_a_grpc_reply_too_large_to_store_replayed_as_nothing_ran() {
    finds(
        11,
        &all_held_back_but(&["HugeReply"]),
        "invariant 2 [o10]: told nothing ran (Declined) under c2, but charge #2 happened under c2",
    );
}

/// Issue 40: both consumer scopes work a message under one callId; a downstream service that
/// deduplicates by callId answers the second scope with the first's work, which is never done —
/// and when both go UNKNOWN, the compensation queue (keyed by callId) keeps only one of them.
#[test]
fn finds_two_consumer_scopes_sharing_one_work_identity() {
    finds(
        0,
        &all_held_back_but(&["SecondScope", "OneDownstream"]),
        "invariant 4 [m0]: the paid event was never worked by email (shipping worked it under c4; the downstream service saw that callId already)",
    );
    finds(
        54,
        &all_held_back_but(&["SecondScope"]),
        "invariant 4: c17 (email) UNKNOWN with no one to settle it",
    );
}

/// Issue 40, defect 5: the seed's incident — a body re-serialised without its `call_id`, the
/// headers intact — is dead-lettered unworked.
#[test]
fn finds_a_message_whose_body_lost_its_call_id_dead_lettered_unworked() {
    finds(
        1,
        &all_held_back_but(&["BodyRewritten"]),
        "invariant 4 [m2]: the placed event was dead-lettered by shipping: the body is neither a samekey envelope nor the handler's payload",
    );
}

/// Issue 40, defect 4: a second message whose body lost its `seq` is read as the first, and
/// dead-lettered as another payload under that identity.
#[test]
fn finds_a_message_whose_body_lost_its_seq_read_as_another() {
    finds(
        2,
        &all_held_back_but(&["BodyRewritten"]),
        "invariant 4 [m0]: the paid event was dead-lettered by shipping: samekey: idempotency key reused",
    );
}

/// Issue 40, defects 1 and 2: a copy whose trace header a middleware rewrote (seed 4), or that
/// kept nothing but the broker's message id (seed 1), is keyed as a foreign message and worked again.
#[test]
fn finds_a_message_whose_headers_were_rewritten_worked_twice() {
    finds(
        4,
        &all_held_back_but(&["HeadersRewritten"]),
        "invariant 1 [m2]: the placed event was worked 2 times by shipping, under c9, c10",
    );
    finds(
        1,
        &all_held_back_but(&["HeadersRewritten"]),
        "invariant 1 [m0]: the paid event was worked 2 times by shipping, under c8, c16",
    );
}

/// Found by the simulation: a consumer redeployed with one more optional field in its payload type
/// dead-letters a redelivery the older consumer worked, as "another payload under this identity".
#[test]
fn finds_a_newer_consumer_dead_lettering_a_redelivery() {
    finds(
        6,
        &all_held_back_but(&["Redeployed"]),
        "invariant 4 [m1]: the paid event was dead-lettered by shipping: samekey: idempotency key reused",
    );
}
