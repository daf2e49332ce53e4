//! The promise, as six generic invariants checked after every history. None is written for a known
//! defect: each states what must hold of any history, whatever happened in it.
//!
//! 1. **At most one effect per key** at the gateways, and never a charge beside its reversal; one
//!    owner at a time: the store accepts no write from an owner that lost the key (watched at every
//!    node's connection, whatever outcome the stale owner writes).
//! 2. **No caller told failed or "nothing ran" for a request whose effect happened**, none told
//!    succeeded for one that did not; no receipt that says either.
//! 3. **Every answer to a duplicate is the first outcome**: one charge number per order, never a
//!    success beside a failure that stands.
//! 4. **Nothing lost**: once faults stop and the worker has run, every receipt is settled (or
//!    `MANUAL` with the escalation hook called), the queue holds nothing else, every effect has a
//!    receipt that says so; every staged message is published and worked once by every consumer
//!    scope, and a dead letter is one worked once whose call is in a person's hands; the reconciliation pass (samekey's `Reconciler`, the gateways'
//!    statements against the service's receipts) reports every disagreement there is, and no other.
//! 5. **One callId per logical call**, each effect traceable to it: the receipt of the callId the
//!    charge carried.
//! 6. **Nothing hangs**: once faults stop, every request is answered within the customers' patience,
//!    no work stays in flight, and the worker settles within a bound.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use samekey::compensation::{CompensationEntry, CompensationState};
use samekey::reconcile::{ReconcileReport, RemoteOutcome, RemoteRecord};
use samekey::{Receipt, ReceiptState};

use crate::customers::{Answer, Told};
use crate::gateway::Effect;
use crate::messaging::{keys_of, DeadLetter, Staged, Work, RERUNS};
use crate::payments::{
    SCOPE_CHECKOUT, SCOPE_PAY, SCOPE_PAY_API, SCOPE_PAY_GRPC, SCOPE_PAY_HOLD, SCOPE_PAY_RERUN,
};
use crate::world::Place;

/// An invariant a history broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which invariant (1 to 6).
    pub invariant: u8,
    /// The order or message it concerns, if one.
    pub subject: Option<String>,
    /// What broke, in a sentence.
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant {}", self.invariant)?;
        if let Some(s) = &self.subject {
            write!(f, " [{s}]")?;
        }
        write!(f, ": {}", self.what)
    }
}

/// What a history left behind, for the check.
#[derive(Debug, Default)]
pub struct Facts {
    /// What every customer was told.
    pub told: Vec<Told>,
    /// What the gateways did.
    pub effects: Vec<Effect>,
    /// What reversals released: (order, the reversal's callId).
    pub releases: Vec<(String, String)>,
    /// Every receipt at the end, and the store it is in.
    pub receipts: Vec<(Place, Receipt)>,
    /// Every compensation entry at the end, and the store it is in.
    pub entries: Vec<(Place, CompensationEntry)>,
    /// The callIds the escalation hook was called for, by store.
    pub escalated: BTreeSet<(Place, String)>,
    /// The order (or shop) each callId was about, for the violations that know only a callId.
    pub subjects: BTreeMap<String, String>,
    /// Writes the store accepted from an owner that no longer held the key.
    pub stale_writes: Vec<String>,
    /// The callbacks a node applied (`Applied`, not `AlreadyApplied`): callId and order.
    pub callbacks_applied: Vec<(String, String)>,
    /// Work still in flight on live nodes at the end.
    pub inflight: Vec<String>,
    /// The final compensation pass did not end within its bound.
    pub settle_hung: bool,
    /// The final compensation pass failed.
    pub settle_failed: Option<String>,
    /// Every message staged in the outbox.
    pub staged: Vec<Staged>,
    /// Every piece of work the consumers' downstream service performed.
    pub work: Vec<Work>,
    /// Every dead letter.
    pub dead_letters: Vec<DeadLetter>,
    /// Messages still in the broker at the end.
    pub undelivered: usize,
    /// The consumer scopes of the run.
    pub scopes: Vec<&'static str>,
    /// The gateways' statements, as the reconciliation pass read them.
    pub statement: Vec<RemoteRecord>,
    /// What the reconciliation pass reported, per scope of the service's store that charges the
    /// gateways under its own callId.
    pub reconciled: Vec<(&'static str, Result<ReconcileReport, String>)>,
}

/// The scopes whose receipts a gateway's statement names by callId (a checkout's receipt never
/// reaches a gateway: its nested `pay` does).
pub const RECONCILED_SCOPES: [&str; 5] = [
    SCOPE_PAY,
    SCOPE_PAY_HOLD,
    SCOPE_PAY_RERUN,
    SCOPE_PAY_API,
    SCOPE_PAY_GRPC,
];

const CHARGING_SCOPES: [&str; 6] = [
    SCOPE_PAY,
    SCOPE_PAY_HOLD,
    SCOPE_PAY_RERUN,
    SCOPE_CHECKOUT,
    SCOPE_PAY_API,
    SCOPE_PAY_GRPC,
];

/// Checks every invariant; an empty list when the history kept the promise.
pub fn check(f: &Facts, short: &dyn Fn(&str) -> String) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut v = |invariant: u8, subject: Option<&str>, what: String| {
        out.push(Violation {
            invariant,
            subject: subject.map(str::to_owned),
            what,
        })
    };
    let mut by_order: BTreeMap<&str, Vec<&Effect>> = BTreeMap::new();
    for e in &f.effects {
        by_order.entry(e.order.as_str()).or_default().push(e);
    }
    // 1. At most one effect per key, and no charge beside its reversal.
    for (order, effects) in &by_order {
        if effects.len() > 1 {
            let list: Vec<String> = effects
                .iter()
                .map(|e| format!("#{} under {}", e.no, short(&e.call_id)))
                .collect();
            v(
                1,
                Some(order),
                format!("charged {} times: {}", effects.len(), list.join(", ")),
            );
        }
    }
    let mut released: BTreeMap<&str, usize> = BTreeMap::new();
    for (order, _) in &f.releases {
        *released.entry(order.as_str()).or_default() += 1;
    }
    for (order, n) in &released {
        if *n > 1 {
            v(
                1,
                Some(order),
                format!("the stock of the order was released {n} times"),
            );
        }
    }
    for (order, call) in &f.releases {
        if let Some(effects) = by_order.get(order.as_str()) {
            v(
                1,
                Some(order),
                format!(
                    "stock released (reversal {}) beside charge #{} under {}",
                    short(call),
                    effects[0].no,
                    short(&effects[0].call_id)
                ),
            );
        }
    }
    // 2 and 3: what callers were told.
    let mut successes: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    let mut failures: BTreeMap<&str, &str> = BTreeMap::new();
    for t in &f.told {
        let effects = by_order
            .get(t.order.as_str())
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let own = |e: &&&Effect| {
            t.call_id.as_deref() == Some(e.call_id.as_str())
                || t.trace_id.as_deref() == Some(e.trace_id.as_str())
        };
        match &t.answer {
            Answer::Succeeded(no) => {
                successes.entry(&t.order).or_default().insert(*no);
                if !effects.iter().any(|e| e.no == *no) {
                    v(
                        2,
                        Some(&t.order),
                        format!("told succeeded with #{no}, a charge that never happened"),
                    );
                }
            }
            Answer::Failed(why) | Answer::NothingRan(why) => {
                if let Answer::Failed(why) = &t.answer {
                    failures.insert(&t.order, why);
                }
                if let Some(e) = effects.iter().find(own) {
                    let said = if matches!(t.answer, Answer::Failed(_)) {
                        "failed"
                    } else {
                        "nothing ran"
                    };
                    v(
                        2,
                        Some(&t.order),
                        format!(
                            "told {said} ({why}) under {}, but charge #{} happened under {}",
                            t.call_id.as_deref().map(short).unwrap_or_default(),
                            e.no,
                            short(&e.call_id)
                        ),
                    );
                }
            }
            _ => {}
        }
    }
    for (order, nos) in &successes {
        if nos.len() > 1 {
            v(
                3,
                Some(order),
                format!("duplicates told different outcomes: charges {nos:?}"),
            );
        }
        if let Some(why) = failures.get(order) {
            v(
                3,
                Some(order),
                format!("told succeeded ({nos:?}) and failed for good ({why})"),
            );
        }
    }
    // 4 and 5: the stores at the end. Two stores (the service's and the API's) may hold the same
    // callId (the API adopts its client's): every record is judged in its own store.
    let of = |place: Place, call: &str| (place, call.to_owned());
    let entries: BTreeMap<(Place, String), &CompensationEntry> = f
        .entries
        .iter()
        .map(|(place, e)| (of(*place, e.call_id.as_str()), e))
        .collect();
    let subject = |call: &str| f.subjects.get(call).cloned();
    for (place, e) in &f.entries {
        let call = e.call_id.as_str();
        if e.state != CompensationState::Manual {
            v(
                4,
                subject(call).as_deref(),
                format!(
                    "{} ({place:?}) still queued ({:?}) after the worker settled: {}",
                    short(call),
                    e.state,
                    e.reason
                ),
            );
        } else if !f.escalated.contains(&of(*place, call)) {
            v(
                4,
                subject(call).as_deref(),
                format!(
                    "{} ({place:?}) is MANUAL but the escalation hook was never called",
                    short(call)
                ),
            );
        }
    }
    let manual = |place: Place, call: &str| {
        entries
            .get(&of(place, call))
            .is_some_and(|e| e.state == CompensationState::Manual)
            && f.escalated.contains(&of(place, call))
    };
    let charge_no = |r: &Receipt| {
        r.outcome
            .as_deref()
            .and_then(|o| serde_json::from_slice::<serde_json::Value>(o).ok())
            .and_then(|v| v.get("no").and_then(serde_json::Value::as_u64))
    };
    let mut receipts: BTreeMap<&str, &Receipt> = BTreeMap::new();
    for (place, r) in &f.receipts {
        let call = r.call_id.as_str();
        let scope = r.key.scope();
        let charging = *place == Place::Service && CHARGING_SCOPES.contains(&scope);
        if charging {
            receipts.insert(call, r);
        }
        match r.state {
            ReceiptState::Processing | ReceiptState::Received if !manual(*place, call) => {
                v(
                    4,
                    subject(call).as_deref(),
                    format!(
                        "{} ({scope}) still {:?} after faults stopped and the worker ran",
                        short(call),
                        r.state
                    ),
                );
            }
            ReceiptState::Unknown if !manual(*place, call) => {
                v(4, subject(call).as_deref(), format!(
                    "{} ({scope}) UNKNOWN with no one to settle it (not MANUAL with the hook called)",
                    short(call)
                ));
            }
            ReceiptState::Success if charging => {
                // The charge it records, made under its own callId (a checkout's, by the `pay` it
                // nests, under another).
                let no = charge_no(r);
                let made = f
                    .effects
                    .iter()
                    .any(|e| Some(e.no) == no && (e.call_id == call || scope == SCOPE_CHECKOUT));
                if !made {
                    v(2, subject(call).as_deref(), format!(
                        "{} ({scope}) recorded SUCCESS ({no:?}) for a charge that never happened under it",
                        short(call)
                    ));
                }
            }
            ReceiptState::Failed if charging => {
                if let Some(e) = f.effects.iter().find(|e| e.call_id == call) {
                    v(
                        2,
                        Some(&e.order),
                        format!(
                            "{} recorded FAILED, but charge #{} happened under it",
                            short(call),
                            e.no
                        ),
                    );
                }
            }
            _ => {}
        }
    }
    for e in &f.effects {
        let traced = match receipts.get(e.call_id.as_str()) {
            Some(r) if r.state == ReceiptState::Success => charge_no(r) == Some(e.no),
            // Uncertain, and in a person's hands: on record as what it is.
            Some(r) if matches!(r.state, ReceiptState::Unknown | ReceiptState::Processing) => {
                manual(Place::Service, e.call_id.as_str())
            }
            _ => false,
        };
        if !traced {
            let found = receipts
                .get(e.call_id.as_str())
                .map(|r| format!("{:?}", r.state))
                .unwrap_or_else(|| "no receipt".into());
            v(
                5,
                Some(&e.order),
                format!(
                    "charge #{} under {} is not on record: {found}",
                    e.no,
                    short(&e.call_id)
                ),
            );
        }
    }
    // One owner at a time: no write of a fenced-out owner lands.
    for what in &f.stale_writes {
        v(1, None, format!("two owners wrote one key: {what}"));
    }
    // Callbacks: each outcome recorded once.
    let mut applied: BTreeMap<&str, usize> = BTreeMap::new();
    for (call, order) in &f.callbacks_applied {
        let n = applied.entry(call.as_str()).or_default();
        *n += 1;
        if *n == 2 {
            v(
                1,
                Some(order),
                format!("two callbacks about {} were both applied", short(call)),
            );
        }
    }
    // Messages: each staged one published, worked once by each consumer scope, none dead-lettered
    // unless worked once and in a person's hands.
    for staged in &f.staged {
        let (order, kind) = (
            &staged.envelope.payload.order,
            &staged.envelope.payload.kind,
        );
        if !staged.sent {
            v(
                4,
                Some(order),
                format!(
                    "the {kind} event ({}) was staged and never published",
                    staged.message.id
                ),
            );
        }
        for &scope in &f.scopes {
            let worked: Vec<&Work> = f
                .work
                .iter()
                .filter(|w| w.scope == scope && &w.order == order && &w.kind == kind)
                .collect();
            if worked.len() > 1 {
                let calls: Vec<String> = worked.iter().map(|w| short(&w.call_id)).collect();
                v(
                    1,
                    Some(order),
                    format!(
                        "the {kind} event was worked {} times by {scope}, under {}",
                        worked.len(),
                        calls.join(", ")
                    ),
                );
            }
            if worked.is_empty() {
                let keys = keys_of(scope, staged);
                // A scope that re-runs an uncertain message on its next delivery leaves none to a
                // person; one that holds it may.
                let held = scope != RERUNS
                    && f.receipts.iter().any(|(place, r)| {
                        *place == Place::Service
                            && keys.iter().any(|k| k.digest() == r.key.digest())
                            && manual(*place, r.call_id.as_str())
                    });
                if !held {
                    let beside = f
                        .work
                        .iter()
                        .find(|w| w.scope != scope && &w.order == order && &w.kind == kind)
                        .map(|w| format!(" ({} worked it under {}; the downstream service saw that callId already)", w.scope, short(&w.call_id)))
                        .unwrap_or_default();
                    v(
                        4,
                        Some(order),
                        format!("the {kind} event was never worked by {scope}{beside}"),
                    );
                }
            }
        }
    }
    for dead in &f.dead_letters {
        let subject = dead.event.as_ref().map(|e| e.0.as_str());
        let kind = dead.event.as_ref().map(|e| e.1.as_str()).unwrap_or("?");
        // Given up after its deliveries ran out, its work done once and its call in a person's
        // hands (`MANUAL`, the hook called): in its dead-letter place with its reason, not lost.
        let in_hand = dead.event.as_ref().is_some_and(|(order, kind)| {
            let worked = f
                .work
                .iter()
                .filter(|w| w.scope == dead.queue && &w.order == order && &w.kind == kind)
                .count();
            let staged = f
                .staged
                .iter()
                .find(|s| &s.envelope.payload.order == order && &s.envelope.payload.kind == kind);
            worked == 1
                && staged.is_some_and(|staged| {
                    let keys = keys_of(&dead.queue, staged);
                    f.receipts.iter().any(|(place, r)| {
                        *place == Place::Service
                            && keys.iter().any(|k| k.digest() == r.key.digest())
                            && manual(*place, r.call_id.as_str())
                    })
                })
        });
        if in_hand {
            continue;
        }
        v(
            4,
            subject,
            format!(
                "the {kind} event was dead-lettered by {}: {}",
                dead.queue, dead.reason
            ),
        );
    }
    if f.undelivered > 0 {
        v(
            6,
            None,
            format!(
                "{} deliveries still in the broker after faults stopped",
                f.undelivered
            ),
        );
    }
    // 6. Nothing hangs.
    for t in &f.told {
        if t.after_faults && t.answer == Answer::GaveUp {
            v(6, Some(&t.order), format!("a request sent after faults stopped got no answer within the customer's patience (node{})", t.node));
        }
    }
    for what in &f.inflight {
        v(
            6,
            Some(what),
            "work still in flight on a live node at the end".into(),
        );
    }
    if f.settle_hung {
        v(
            6,
            None,
            "the compensation worker did not settle within its bound".into(),
        );
    }
    if let Some(e) = &f.settle_failed {
        v(
            4,
            None,
            format!("the compensation worker could not settle: {e}"),
        );
    }
    for (scope, report) in &f.reconciled {
        if let Some(what) = misreconciled(f, scope, report) {
            v(4, None, what);
        }
    }
    out
}

/// The reconciliation pass of `scope` against what is true: it must report every disagreement
/// between the gateways' statements and the service's receipts — a disagreement it misses is lost to
/// the people who read its report — and none that is not there. `None` when it did.
fn misreconciled(
    f: &Facts,
    scope: &str,
    report: &Result<ReconcileReport, String>,
) -> Option<String> {
    let report = match report {
        Ok(report) => report,
        Err(e) => return Some(format!("the reconciliation of {scope} failed: {e}")),
    };
    let here: BTreeMap<&str, &Receipt> = f
        .receipts
        .iter()
        .filter(|(place, _)| *place == Place::Service)
        .map(|(_, r)| (r.call_id.as_str(), r))
        .collect();
    let mut truth = ReconcileReport::default();
    let mut mentioned = BTreeSet::new();
    for record in &f.statement {
        let Some(call_id) = &record.call_id else {
            continue;
        };
        truth.remote_records += 1;
        mentioned.insert(call_id.as_str());
        match here.get(call_id.as_str()) {
            None => truth.missing_here += 1,
            Some(r) if r.key.scope() != scope => truth.outside_query += 1,
            Some(r) => match (r.state, record.outcome) {
                (ReceiptState::Success, RemoteOutcome::Succeeded)
                | (ReceiptState::Failed, RemoteOutcome::Failed) => truth.matched += 1,
                _ => truth.state_mismatches += 1,
            },
        }
    }
    for r in here.values().filter(|r| r.key.scope() == scope) {
        truth.receipts += 1;
        if !mentioned.contains(r.call_id.as_str()) {
            truth.missing_there += 1;
        }
    }
    let counts = |r: &ReconcileReport| {
        [
            r.remote_records,
            r.receipts,
            r.matched,
            r.missing_here,
            r.missing_there,
            r.state_mismatches,
            r.outside_query,
        ]
    };
    (counts(report) != counts(&truth)).then(|| {
        format!(
            "the reconciliation of {scope} reported [records, receipts, matched, missing here, \
             missing there, state mismatches, outside] = {:?}; the truth is {:?}",
            counts(report),
            counts(&truth)
        )
    })
}
