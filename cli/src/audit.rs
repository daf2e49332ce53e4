//! `samekey audit`: what should never happen or needs a person, found in the receipts, the
//! compensation queue and the journals.
//!
//! * **double execution**: a key whose journal shows more than one attempt that took effect — within
//!   one call (an owner that stalled past its lease and came back after another took over) or across
//!   two calls that ran at once;
//! * **stuck PROCESSING**: a call whose owner's lease ended (it crashed, or stalls) and that nothing
//!   settled;
//! * **old UNKNOWN**: a call whose outcome nobody established for longer than a threshold;
//! * **MANUAL**: a compensation entry whose rounds ran out, waiting for a person;
//! * **journal gap**: an UNKNOWN call with no journal (its events were lost), or a journal that
//!   reached its bound and dropped its oldest events.
//!
//! The receipts are read page by page over the range; journals only where the store has them (the
//! happy path writes none), so an audit of a day of 10⁶ receipts reads the day once.

use std::collections::BTreeMap;

use clap::Args;
use samekey_runtime::journal::{AttemptOutcome, JOURNAL_LIMIT};
use samekey_runtime::{
    compensation::CompensationState, journal::Event, journal::EventKind, Key, ReceiptState, Runtime,
};
use serde::Serialize;
use serde_json::json;

use crate::args::{duration_arg, store_now, RangeArgs};
use crate::output::{Format, Out, Progress, Tone};
use crate::{Failure, Verdict};

/// Journaled keys read per page: large, since a Redis store scans its keyspace for each page.
const JOURNAL_PAGE: usize = 10_000;

#[derive(Args)]
pub struct AuditArgs {
    /// Receipts created at or after: an RFC 3339 time or a time ago.
    #[arg(long, default_value = "30d")]
    since: String,
    /// Receipts created before (default: now).
    #[arg(long)]
    until: Option<String>,
    /// Only this scope.
    #[arg(long)]
    scope: Option<String>,
    /// Only calls made by this node (the last field of their callIds).
    #[arg(long)]
    node: Option<String>,
    /// Report an UNKNOWN that has not changed for this long.
    #[arg(long, default_value = "1h")]
    unknown_older_than: String,
    /// Report a PROCESSING call once its owner's lease ended this long ago.
    #[arg(long, default_value = "0s")]
    stuck_after: String,
}

/// What kind of finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    DoubleExecution,
    StuckProcessing,
    OldUnknown,
    Manual,
    JournalGap,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::DoubleExecution => "double execution",
            Kind::StuckProcessing => "stuck PROCESSING",
            Kind::OldUnknown => "old UNKNOWN",
            Kind::Manual => "MANUAL",
            Kind::JournalGap => "journal gap",
        }
    }
}

/// One thing the audit found.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub kind: Kind,
    pub call_id: Option<String>,
    pub scope: String,
    pub key: String,
    /// When it began (Unix ms).
    #[serde(skip)]
    pub at_ms: u64,
    pub detail: String,
}

/// What the audit read.
#[derive(Debug, Default, Serialize)]
struct Checked {
    receipts: u64,
    journals: u64,
    queued: u64,
}

pub async fn audit(rt: &Runtime, args: AuditArgs, out: &mut Out) -> Result<Verdict, Failure> {
    let range = RangeArgs {
        since: args.since.clone(),
        until: args.until.clone(),
        scope: args.scope.clone(),
        state: Vec::new(),
        node: args.node.clone(),
    };
    let query = range.query()?;
    let unknown_after = duration_arg(&args.unknown_older_than, "unknown-older-than")?;
    let stuck_after = duration_arg(&args.stuck_after, "stuck-after")?;
    let now = store_now(rt).await?;
    let store = rt.store();
    let mut findings = Vec::new();
    let mut checked = Checked::default();

    // Every receipt of the range, once: the unsettled ones stuck, old, or without the journal an
    // UNKNOWN always leaves.
    let mut page_query = query.clone();
    let mut progress = Progress::new("audit: receipts read");
    loop {
        let page = store
            .list_receipts(&page_query, now)
            .await
            .map_err(Failure::store)?;
        checked.receipts += page.receipts.len() as u64;
        progress.tick(checked.receipts);
        for r in page.receipts.iter().filter(|r| range.admits(r)) {
            let found = |kind, at_ms, detail: String| Finding {
                kind,
                call_id: Some(r.call_id.to_string()),
                scope: r.key.scope().to_owned(),
                key: r.key.to_hex(),
                at_ms,
                detail,
            };
            match r.state {
                ReceiptState::Unknown => {
                    if r.updated_ms.saturating_add(unknown_after) <= now {
                        let age = humantime::format_duration(whole_seconds(now - r.updated_ms));
                        findings.push(found(Kind::OldUnknown, r.updated_ms, format!(
                            "UNKNOWN for {age}: no lookup settled it (samekey compensation show {})", r.call_id
                        )));
                    }
                    let journal = store
                        .journal_of_call(&r.call_id, now)
                        .await
                        .map_err(Failure::store)?;
                    if journal.is_empty() {
                        findings.push(found(
                            Kind::JournalGap,
                            r.updated_ms,
                            "UNKNOWN with no journal: the events that led there were lost".into(),
                        ));
                    }
                }
                ReceiptState::Received | ReceiptState::Processing => {
                    if let Some(lease) = r.lease_until_ms {
                        if lease.saturating_add(stuck_after) <= now {
                            let ago = humantime::format_duration(whole_seconds(now - lease));
                            findings.push(found(Kind::StuckProcessing, r.created_ms, format!(
                                "{} and its owner's lease ended {ago} ago: the owner crashed or stalls; a compensation worker's sweep queues it",
                                r.state
                            )));
                        }
                    }
                }
                _ => {}
            }
        }
        match page.next {
            Some(at) => page_query = page_query.after(at),
            None => break,
        }
    }
    drop(progress);

    // The queue: entries waiting for a person.
    for entry in store.list_compensations().await.map_err(Failure::store)? {
        checked.queued += 1;
        let other_node = args
            .node
            .as_deref()
            .is_some_and(|n| n != entry.call_id.node());
        if other_node
            || args
                .scope
                .as_deref()
                .is_some_and(|s| s != entry.key.scope())
        {
            continue;
        }
        if entry.state == CompensationState::Manual {
            findings.push(Finding {
                kind: Kind::Manual,
                call_id: Some(entry.call_id.to_string()),
                scope: entry.key.scope().to_owned(),
                key: entry.key.to_hex(),
                at_ms: entry.next_at_ms,
                detail: format!(
                    "needs a person after {} rounds: {} (samekey compensation resolve {} --as …)",
                    entry.round, entry.reason, entry.call_id
                ),
            });
        }
    }

    // The journals: more than one effect on a key, or a journal that dropped events.
    let mut after = None;
    let mut progress = Progress::new("audit: journals read");
    loop {
        let keys = store
            .journaled_keys(after, JOURNAL_PAGE)
            .await
            .map_err(Failure::store)?;
        let Some(last) = keys.last() else { break };
        after = Some(*last.digest());
        for key in keys {
            let events = store.journal(&key, now).await.map_err(Failure::store)?;
            if events.is_empty() {
                continue;
            }
            checked.journals += 1;
            progress.tick(checked.journals);
            let scope = match store.get(&key, now).await.map_err(Failure::store)? {
                Some(r) => r.key.scope().to_owned(),
                None => String::new(),
            };
            if args.scope.as_deref().is_some_and(|s| s != scope) {
                continue;
            }
            for mut finding in journal_findings(&key, &events) {
                if (query.since_ms..query.until_ms).contains(&finding.at_ms) {
                    finding.scope.clone_from(&scope);
                    findings.push(finding);
                }
            }
        }
    }
    drop(progress);

    findings.sort_by_key(|f| (f.kind, f.at_ms));
    print(out, &findings, &checked);
    Ok(if findings.is_empty() {
        Verdict::Done
    } else {
        Verdict::Found
    })
}

fn whole_seconds(ms: u64) -> std::time::Duration {
    std::time::Duration::from_secs(ms / 1000)
}

/// One call's span in a key's journal (first and last position) and its attempts that took effect.
struct Call<'e> {
    first: usize,
    last: usize,
    effects: Vec<&'e Event>,
}

/// What one key's journal shows: attempts that took effect more than once (in one call, or in two
/// calls that ran at once), and a journal at its bound.
pub fn journal_findings(key: &Key, events: &[Event]) -> Vec<Finding> {
    let mut findings = Vec::new();
    if events.len() >= JOURNAL_LIMIT {
        findings.push(Finding {
            kind: Kind::JournalGap,
            call_id: events.first().map(|e| e.call_id.to_string()),
            scope: String::new(),
            key: key.to_hex(),
            at_ms: events.first().map_or(0, |e| e.at_ms),
            detail: format!(
                "the journal holds its latest {JOURNAL_LIMIT} events: older ones were dropped"
            ),
        });
    }
    // A forgotten call's key starts afresh: a later call on it is a new operation (an epoch).
    let mut epochs: Vec<BTreeMap<String, Call>> = vec![BTreeMap::new()];
    for (i, event) in events.iter().enumerate() {
        if matches!(event.what, EventKind::Forgotten { .. }) {
            epochs.push(BTreeMap::new());
            continue;
        }
        let Some(calls) = epochs.last_mut() else {
            continue;
        };
        let call = calls.entry(event.call_id.to_string()).or_insert(Call {
            first: i,
            last: i,
            effects: Vec::new(),
        });
        call.last = i;
        if matches!(
            event.what,
            EventKind::Attempt {
                outcome: AttemptOutcome::Ok,
                ..
            }
        ) {
            call.effects.push(event);
        }
    }
    let describe = |effects: &[&Event]| {
        effects
            .iter()
            .map(|e| match &e.what {
                EventKind::Attempt { attempt, .. } => format!("attempt {attempt} on {}", e.node),
                _ => format!("on {}", e.node),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    for calls in &epochs {
        findings.extend(effects_of(key, calls, &describe));
    }
    findings
}

/// Findings of one epoch of a key's calls.
fn effects_of(
    key: &Key,
    calls: &BTreeMap<String, Call<'_>>,
    describe: &dyn Fn(&[&Event]) -> String,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    for (call_id, call) in calls {
        if call.effects.len() > 1 {
            findings.push(Finding {
                kind: Kind::DoubleExecution,
                call_id: Some(call_id.clone()),
                scope: String::new(),
                key: key.to_hex(),
                at_ms: call.effects[1].at_ms,
                detail: format!(
                    "{} attempts of one call took effect ({}): did the remote deduplicate by callId?",
                    call.effects.len(),
                    describe(&call.effects)
                ),
            });
        }
    }
    let effective: Vec<(&String, &Call)> = calls
        .iter()
        .filter(|(_, c)| !c.effects.is_empty())
        .collect();
    for (i, (a_id, a)) in effective.iter().enumerate() {
        for (b_id, b) in &effective[i + 1..] {
            if a.first <= b.last && b.first <= a.last {
                findings.push(Finding {
                    kind: Kind::DoubleExecution,
                    call_id: Some(format!("{a_id}, {b_id}")),
                    scope: String::new(),
                    key: key.to_hex(),
                    at_ms: a.effects[0].at_ms.max(b.effects[0].at_ms),
                    detail: "two calls ran at once on one key and both took effect: the key's claim did not hold".into(),
                });
            }
        }
    }
    findings
}

fn print(out: &mut Out, findings: &[Finding], checked: &Checked) {
    let json_of = |out: &Out, f: &Finding| {
        let mut value = serde_json::to_value(f).unwrap_or_default();
        value["since"] = json!(out.time(f.at_ms));
        value
    };
    match out.format() {
        Format::Json => {
            let doc = json!({
                "findings": findings.iter().map(|f| json_of(out, f)).collect::<Vec<_>>(),
                "checked": checked,
                "clean": findings.is_empty(),
            });
            out.json(&doc);
        }
        Format::Jsonl => {
            for f in findings {
                let line = json_of(out, f);
                out.json(&line);
            }
        }
        Format::Table => {
            if !findings.is_empty() {
                out.line(format!(
                    "{:<18}  {:<29}  {:<20}  {:<48}  DETAIL",
                    "KIND", "SINCE", "SCOPE", "CALL ID"
                ));
            }
            for f in findings {
                let tone = match f.kind {
                    Kind::DoubleExecution | Kind::Manual => Tone::Bad,
                    _ => Tone::Warn,
                };
                let kind = out.paint(f.kind.label(), tone, 18);
                let scope = if f.scope.is_empty() { "-" } else { &f.scope };
                out.line(format!(
                    "{kind}  {:<29}  {scope:<20}  {:<48}  {}",
                    out.time(f.at_ms),
                    f.call_id.as_deref().unwrap_or("-"),
                    f.detail
                ));
            }
            let read = format!(
                "{} receipts, {} journals, {} queued entries read",
                checked.receipts, checked.journals, checked.queued
            );
            if findings.is_empty() {
                let clean = out.paint("clean", Tone::Good, 0);
                out.line(format!("{clean}: {read}"));
            } else {
                let mut by_kind: BTreeMap<Kind, usize> = BTreeMap::new();
                for f in findings {
                    *by_kind.entry(f.kind).or_default() += 1;
                }
                let kinds: Vec<String> = by_kind
                    .iter()
                    .map(|(kind, n)| format!("{n} {}", kind.label()))
                    .collect();
                out.line(format!(
                    "{} findings ({}); {read}",
                    findings.len(),
                    kinds.join(", ")
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use samekey_runtime::{key::KeyBuilder, CallId, ReceiptState};

    use super::*;

    fn event(call_id: &CallId, node: &str, what: EventKind) -> Event {
        Event {
            call_id: call_id.clone(),
            at_ms: 1_000,
            node: node.into(),
            what,
        }
    }

    fn ok(attempt: u32) -> EventKind {
        EventKind::Attempt {
            attempt,
            started_ms: 900,
            outcome: AttemptOutcome::Ok,
            error: None,
        }
    }

    fn timed_out(attempt: u32) -> EventKind {
        EventKind::Attempt {
            attempt,
            started_ms: 900,
            outcome: AttemptOutcome::TimedOut,
            error: None,
        }
    }

    #[test]
    fn one_effect_per_call_is_clean_and_a_second_is_found() {
        let key = KeyBuilder::new("orders.charge").finish();
        let a = CallId::new("pay", "api-1").unwrap();
        let retried = [event(&a, "api-1", timed_out(1)), event(&a, "api-1", ok(2))];
        assert!(journal_findings(&key, &retried).is_empty());

        // The first owner stalled past its lease; another took over under the same callId; both ran.
        let stalled = [
            event(
                &a,
                "api-2",
                EventKind::TookOver {
                    from: ReceiptState::Processing,
                    fence: 2,
                },
            ),
            event(&a, "api-2", ok(1)),
            event(&a, "api-1", ok(1)),
            event(&a, "api-1", EventKind::FencedOut),
        ];
        let found = journal_findings(&key, &stalled);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].kind, Kind::DoubleExecution);
        assert_eq!(
            found[0].detail,
            "2 attempts of one call took effect (attempt 1 on api-2, attempt 1 on api-1): did the remote deduplicate by callId?"
        );
    }

    #[test]
    fn two_calls_at_once_are_found_but_one_after_a_forget_is_not() {
        let key = KeyBuilder::new("orders.charge").finish();
        let (a, b) = (
            CallId::new("pay", "api-1").unwrap(),
            CallId::new("pay", "api-2").unwrap(),
        );
        let at_once = [
            event(&a, "api-1", timed_out(1)),
            event(&b, "api-2", ok(1)),
            event(&a, "api-1", ok(2)),
        ];
        let found = journal_findings(&key, &at_once);
        assert_eq!(found.len(), 1, "{found:?}");
        let ids = found[0].call_id.clone().unwrap_or_default();
        assert!(
            ids.contains(&a.to_string()) && ids.contains(&b.to_string()),
            "{ids}"
        );

        let forgotten = EventKind::Forgotten {
            state: ReceiptState::Success,
            who: "alice".into(),
            why: "ticket".into(),
        };
        let redone = [
            event(&a, "api-1", ok(2)),
            event(&a, "cli", forgotten),
            event(&b, "api-2", timed_out(1)),
            event(&b, "api-2", ok(2)),
        ];
        assert!(journal_findings(&key, &redone).is_empty());
    }

    #[test]
    fn a_full_journal_is_a_gap() {
        let key = KeyBuilder::new("orders.charge").finish();
        let a = CallId::new("pay", "api-1").unwrap();
        let full: Vec<Event> = (0..JOURNAL_LIMIT as u32)
            .map(|n| {
                event(
                    &a,
                    "api-1",
                    EventKind::Backoff {
                        attempt: n,
                        delay_ms: 1,
                    },
                )
            })
            .collect();
        let found = journal_findings(&key, &full);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].kind, Kind::JournalGap);
    }
}
