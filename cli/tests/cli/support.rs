//! A store planted with what an operator meets: a paid call that was retried, a call that ran twice,
//! a call left UNKNOWN and escalated, an owner that crashed mid-call — on any backend.

#![allow(dead_code)]

use std::sync::Arc;

use assert_cmd::Command;
use samekey_runtime::journal::AttemptOutcome;
use samekey_runtime::store::{Claim, Claimed, Completion};
use samekey_runtime::{
    compensation::CompensationEntry, journal::Event, journal::EventKind, key::KeyBuilder,
    receipt::Fence, CallId, Key, ReceiptState, Store,
};

/// 2026-11-30T09:00:00Z: when the SQLite store's planted calls happen.
pub const T0: u64 = 1_796_029_200_000;

/// Ten years: planted receipts and journals outlive any test.
const LONG: u64 = 10 * 365 * 24 * 3600 * 1000;

pub struct Planted {
    pub scope: String,
    pub paid: CallId,
    pub paid_key: Key,
    pub twice: CallId,
    pub unknown: CallId,
    pub unknown_key: Key,
    pub stuck: CallId,
    pub stuck_key: Key,
}

pub fn key_of(scope: &str, order: u64) -> Key {
    let mut key = KeyBuilder::new(scope);
    key.part(&order);
    key.part("charge");
    key.finish()
}

/// A callId fixed by `n` (its time is `T0`), so that what the command prints does not change.
pub fn fixed_call(n: u64, node: &str) -> CallId {
    format!("pay-{T0}-{n:016x}-{node}").parse().unwrap()
}

async fn claim(store: &dyn Store, key: &Key, call_id: &CallId, lease_ms: u64, now: u64) -> Fence {
    let claim = Claim {
        key: key.clone(),
        call_id: call_id.clone(),
        fingerprint: None,
        lease_ms,
        now_ms: now,
    };
    match store.claim(claim).await.unwrap() {
        Claimed::Acquired(fence) => fence,
        other => panic!("{other:?}"),
    }
}

fn event(call_id: &CallId, at_ms: u64, node: &str, what: EventKind) -> Event {
    Event {
        call_id: call_id.clone(),
        at_ms,
        node: node.into(),
        what,
    }
}

fn attempt(attempt: u32, started_ms: u64, outcome: AttemptOutcome) -> EventKind {
    EventKind::Attempt {
        attempt,
        started_ms,
        outcome,
        error: (outcome != AttemptOutcome::Ok).then(|| "gateway timeout".to_owned()),
    }
}

fn paid(outcome: &str) -> Completion {
    Completion {
        state: ReceiptState::Success,
        outcome: Some(Arc::from(outcome.as_bytes())),
        ttl_ms: LONG,
    }
}

/// Plants the four calls under `scope` at `now` (the caller's time, which SQLite judges by; a server
/// judges by its own clock). `n` makes the callIds (fixed for snapshots, or fresh).
pub async fn plant(
    store: &dyn Store,
    scope: &str,
    now: u64,
    ids: impl Fn(u64, &str) -> CallId,
) -> Planted {
    let t = |ms: u64| now + ms;

    // A charge whose first attempt timed out and whose second succeeded.
    let paid_id = ids(1, "api-1");
    let paid_key = key_of(scope, 42);
    let fence = claim(store, &paid_key, &paid_id, 30_000, now).await;
    let events = [
        event(
            &paid_id,
            t(0),
            "api-1",
            EventKind::Claimed { fence: fence.0 },
        ),
        event(
            &paid_id,
            t(2_000),
            "api-1",
            attempt(1, t(0), AttemptOutcome::TimedOut),
        ),
        event(
            &paid_id,
            t(2_000),
            "api-1",
            EventKind::Backoff {
                attempt: 1,
                delay_ms: 200,
            },
        ),
        event(
            &paid_id,
            t(2_450),
            "api-1",
            attempt(2, t(2_200), AttemptOutcome::Ok),
        ),
    ];
    store
        .append_journal(&paid_key, &events, LONG, now)
        .await
        .unwrap();
    store
        .complete(
            &paid_key,
            fence,
            paid(r#"{"charge":"ch_1","amount":500}"#),
            t(2_450),
        )
        .await
        .unwrap();

    // A charge whose owner stalled past its lease: another node took it over under the same callId,
    // and both attempts reached the provider.
    let twice = ids(2, "api-1");
    let twice_key = key_of(scope, 44);
    let first = claim(store, &twice_key, &twice, 30_000, now).await;
    let events = [
        event(&twice, t(0), "api-1", EventKind::Claimed { fence: first.0 }),
        event(
            &twice,
            t(31_000),
            "api-2",
            EventKind::TookOver {
                from: ReceiptState::Processing,
                fence: first.0 + 1,
            },
        ),
        event(
            &twice,
            t(31_400),
            "api-2",
            attempt(1, t(31_000), AttemptOutcome::Ok),
        ),
        event(
            &twice,
            t(33_000),
            "api-1",
            attempt(1, t(100), AttemptOutcome::Ok),
        ),
        event(&twice, t(33_000), "api-1", EventKind::FencedOut),
    ];
    store
        .append_journal(&twice_key, &events, LONG, now)
        .await
        .unwrap();
    store
        .complete(
            &twice_key,
            first,
            paid(r#"{"charge":"ch_2","amount":700}"#),
            t(33_000),
        )
        .await
        .unwrap();

    // A charge whose reply was lost and that nobody could settle: UNKNOWN, then MANUAL.
    let unknown = ids(3, "api-1");
    let unknown_key = key_of(scope, 43);
    let fence = claim(store, &unknown_key, &unknown, 30_000, now).await;
    let events = [
        event(
            &unknown,
            t(2_000),
            "api-1",
            attempt(1, t(0), AttemptOutcome::TimedOut),
        ),
        event(
            &unknown,
            t(2_000),
            "api-1",
            EventKind::Unknown {
                reason: "timed out; no lookup".into(),
            },
        ),
    ];
    store
        .append_journal(&unknown_key, &events, LONG, now)
        .await
        .unwrap();
    store
        .mark_unknown(&unknown_key, fence, t(2_000))
        .await
        .unwrap();
    let mut entry = CompensationEntry::new(
        unknown.clone(),
        unknown_key.clone(),
        "timed out; no lookup",
        t(2_000),
    );
    entry.attempts = 1;
    entry.last_error = Some(AttemptOutcome::TimedOut);
    entry.encoded_inputs = Some(Arc::from(&br#"["o-43",500]"#[..]));
    store.enqueue_compensation(entry).await.unwrap();
    store
        .escalate_compensation(&unknown, Fence(0), t(3_000))
        .await
        .unwrap();

    // An owner that crashed mid-call: PROCESSING, its lease long over, nothing queued.
    let stuck = ids(4, "api-3");
    let stuck_key = key_of(scope, 45);
    claim(store, &stuck_key, &stuck, 1, now).await;

    Planted {
        scope: scope.to_owned(),
        paid: paid_id,
        paid_key,
        twice,
        unknown,
        unknown_key,
        stuck,
        stuck_key,
    }
}

/// The built binary, on `store`.
pub fn samekey(store: &str) -> Command {
    let mut cmd = Command::cargo_bin("samekey").unwrap();
    cmd.env("SAMEKEY_STORE", store).env_remove("NO_COLOR");
    cmd
}

/// Runs it; answers its exit code, stdout and stderr.
pub fn run(cmd: &mut Command) -> (i32, String, String) {
    let output = cmd.output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

/// Runs it, expecting exit 0; answers stdout.
pub fn stdout(cmd: &mut Command) -> String {
    let (code, out, err) = run(cmd);
    assert_eq!(code, 0, "stderr: {err}\nstdout: {out}");
    out
}
