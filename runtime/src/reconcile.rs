//! Reconciliation: this side's receipts over a time range against the counterparty's records of the
//! same calls (a settlement file, an export), by callId.
//!
//! Prevention (keys, callIds, lookups) never makes the other side's system perfect; a daily comparison
//! is the net under it. [`Reconciler::run`] reads the counterparty's records as a stream (a CSV or
//! JSON-lines reader is provided: [`read_csv`], [`read_jsonl`]), looks each one up here by callId,
//! then walks this side's receipts of the range in pages and reports those the other side never
//! mentioned.
//!
//! # Memory
//!
//! Bounded by the day's size, not its content: one 64-bit hash per counterparty record (to find this
//! side's receipts it never mentioned), one batch of counterparty records (1 000, looked up at once:
//! one statement on the SQL stores) and one page of receipts at a time, and the first
//! [`Reconciler::examples`] discrepancies of each kind. Counts are exact.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::{BufRead, Read};

use serde::Deserialize;

use crate::call_id::CallId;
use crate::error::Error;
use crate::receipt::{Receipt, ReceiptState};
use crate::runtime::Runtime;
use crate::store::ReceiptQuery;

/// What the counterparty says became of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteOutcome {
    /// It took effect.
    Succeeded,
    /// It failed.
    Failed,
}

/// One record of the counterparty: the call (by the callId sent to it), its outcome and, when the
/// record has one, the amount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteRecord {
    /// The callId this side sent.
    pub call_id: CallId,
    /// What became of it there.
    pub outcome: RemoteOutcome,
    /// The amount there (minor units), when the record carries one.
    pub amount: Option<i64>,
}

/// A record of the counterparty's file that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record {record} cannot be read: {reason}")]
pub struct ReadError {
    /// The record's number in the file, from 1 (a line, or a CSV row after the header).
    pub record: u64,
    /// Why.
    pub reason: String,
}

/// One disagreement between the two sides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discrepancy {
    /// The counterparty has the call; this side has no receipt of it (never made here, or expired).
    MissingHere {
        /// The call.
        call_id: CallId,
    },
    /// This side has a receipt the counterparty never mentioned.
    MissingThere {
        /// The call.
        call_id: CallId,
        /// Its state here.
        state: ReceiptState,
    },
    /// Both have it, with different outcomes (`UNKNOWN` or `PROCESSING` here counts as different).
    StateMismatch {
        /// The call.
        call_id: CallId,
        /// Its state here.
        here: ReceiptState,
        /// Its outcome there.
        there: RemoteOutcome,
    },
    /// Both say it succeeded, for different amounts.
    AmountMismatch {
        /// The call.
        call_id: CallId,
        /// The amount here.
        here: i64,
        /// The amount there.
        there: i64,
    },
    /// A record of the counterparty's file could not be read.
    Unreadable(ReadError),
}

/// What a reconciliation found. Counts are exact; `examples` holds the first discrepancies of each
/// kind, up to [`Reconciler::examples`] each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Counterparty records read.
    pub remote_records: u64,
    /// This side's receipts in the range.
    pub receipts: u64,
    /// Calls on which both sides agree.
    pub matched: u64,
    /// See [`Discrepancy::MissingHere`].
    pub missing_here: u64,
    /// See [`Discrepancy::MissingThere`].
    pub missing_there: u64,
    /// See [`Discrepancy::StateMismatch`].
    pub state_mismatches: u64,
    /// See [`Discrepancy::AmountMismatch`].
    pub amount_mismatches: u64,
    /// See [`Discrepancy::Unreadable`].
    pub unreadable: u64,
    /// Counterparty records whose receipt here lies outside the query (another scope or state,
    /// created outside the range): not compared.
    pub outside_query: u64,
    /// Counterparty records repeating a callId already read: not compared again.
    pub repeated: u64,
    /// The first discrepancies of each kind, with the callIds to look at.
    pub examples: Vec<Discrepancy>,
}

impl Report {
    /// Whether both sides agree on every call.
    pub fn is_clean(&self) -> bool {
        self.missing_here
            + self.missing_there
            + self.state_mismatches
            + self.amount_mismatches
            + self.unreadable
            == 0
    }
}

/// Counterparty records looked up at once.
const LOOKUP_BATCH: usize = 1_000;

type AmountOf = Box<dyn Fn(&Receipt) -> Option<i64> + Send + Sync>;

/// Compares the receipts a [`ReceiptQuery`] selects with the counterparty's records.
///
/// ```
/// # use samekey_runtime::reconcile::{read_jsonl, Reconciler};
/// # use samekey_runtime::{store::ReceiptQuery, Runtime};
/// # async fn demo(rt: Runtime, day_start: u64) -> Result<(), samekey_runtime::Error> {
/// let file: &[u8] = br#"{"call_id": "pay-1-00000000000000ff-api-7", "status": "succeeded"}"#;
/// let day = ReceiptQuery::created_between(day_start, day_start + 86_400_000).scope("orders.charge");
/// let report = Reconciler::new(&rt, day).run(read_jsonl(std::io::BufReader::new(file))).await?;
/// if !report.is_clean() {
///     eprintln!("{report:#?}");
/// }
/// # Ok(()) }
/// ```
pub struct Reconciler {
    rt: Runtime,
    query: ReceiptQuery,
    amount: Option<AmountOf>,
    examples: usize,
}

impl Reconciler {
    /// Compares the receipts `query` selects (its range, scope and states; its cursor and page size
    /// are used to walk them) with the counterparty's records.
    pub fn new(rt: &Runtime, query: ReceiptQuery) -> Reconciler {
        Reconciler {
            rt: rt.clone(),
            query,
            amount: None,
            examples: 1_000,
        }
    }

    /// How to read the amount of a successful receipt here (from its stored result), to compare it
    /// with the counterparty's; without it, amounts are not compared.
    pub fn amount(
        mut self,
        amount_of: impl Fn(&Receipt) -> Option<i64> + Send + Sync + 'static,
    ) -> Reconciler {
        self.amount = Some(Box::new(amount_of));
        self
    }

    /// How many discrepancies of each kind the report lists (default 1 000); counts stay exact.
    pub fn examples(mut self, examples: usize) -> Reconciler {
        self.examples = examples;
        self
    }

    /// Reads the counterparty's records, then this side's receipts, and reports. A store that fails
    /// ends it with the error; an unreadable record is a discrepancy, and the rest is read.
    pub async fn run(
        self,
        remote: impl IntoIterator<Item = Result<RemoteRecord, ReadError>>,
    ) -> Result<Report, Error> {
        let store = self.rt.store();
        let mut report = Report::default();
        let mut kinds = [0usize; 6];
        let mut seen: HashSet<u64> = HashSet::new();
        // The counterparty's records are looked up a batch at a time (one statement on the SQL
        // stores), then compared in the file's order.
        let mut batch: Vec<RemoteRecord> = Vec::with_capacity(LOOKUP_BATCH);
        let mut remote = remote.into_iter().peekable();
        while remote.peek().is_some() {
            batch.clear();
            for record in remote.by_ref() {
                match record {
                    Ok(record) => {
                        report.remote_records += 1;
                        if seen.insert(fingerprint(&record.call_id)) {
                            batch.push(record);
                        } else {
                            report.repeated += 1;
                        }
                    }
                    Err(e) => {
                        report.unreadable += 1;
                        self.example(&mut report, &mut kinds, 5, Discrepancy::Unreadable(e));
                    }
                }
                if batch.len() == LOOKUP_BATCH {
                    break;
                }
            }
            let ids: Vec<CallId> = batch.iter().map(|r| r.call_id.clone()).collect();
            let mut found: HashMap<String, Receipt> = store
                .get_by_call_ids(&ids)
                .await?
                .into_iter()
                .map(|r| (r.call_id.as_str().to_owned(), r))
                .collect();
            for record in batch.drain(..) {
                let here = found.remove(record.call_id.as_str());
                self.compare(record, here, &mut report, &mut kinds);
            }
        }
        let mut query = self.query.clone();
        loop {
            let page = store.list_receipts(&query, self.rt.now_ms()).await?;
            for receipt in page.receipts {
                report.receipts += 1;
                if !seen.contains(&fingerprint(&receipt.call_id)) {
                    report.missing_there += 1;
                    let found = Discrepancy::MissingThere {
                        call_id: receipt.call_id,
                        state: receipt.state,
                    };
                    self.example(&mut report, &mut kinds, 1, found);
                }
            }
            match page.next {
                Some(next) => query = self.query.clone().after(next),
                None => break,
            }
        }
        Ok(report)
    }

    /// Compares one counterparty record with this side's receipt of its call (`None`: none here).
    fn compare(
        &self,
        record: RemoteRecord,
        here: Option<Receipt>,
        report: &mut Report,
        kinds: &mut [usize; 6],
    ) {
        let Some(here) = here else {
            report.missing_here += 1;
            let found = Discrepancy::MissingHere {
                call_id: record.call_id,
            };
            self.example(report, kinds, 0, found);
            return;
        };
        let in_range = (self.query.since_ms..self.query.until_ms).contains(&here.created_ms);
        if !in_range || !self.query.admits(&here) {
            report.outside_query += 1;
            return;
        }
        let agree = matches!(
            (here.state, record.outcome),
            (ReceiptState::Success, RemoteOutcome::Succeeded)
                | (ReceiptState::Failed, RemoteOutcome::Failed)
        );
        if !agree {
            report.state_mismatches += 1;
            let found = Discrepancy::StateMismatch {
                call_id: record.call_id,
                here: here.state,
                there: record.outcome,
            };
            self.example(report, kinds, 2, found);
            return;
        }
        let amounts = match (&self.amount, record.amount) {
            (Some(amount_of), Some(there)) if here.state == ReceiptState::Success => {
                amount_of(&here).map(|here| (here, there))
            }
            _ => None,
        };
        match amounts {
            Some((here, there)) if here != there => {
                report.amount_mismatches += 1;
                let found = Discrepancy::AmountMismatch {
                    call_id: record.call_id,
                    here,
                    there,
                };
                self.example(report, kinds, 3, found);
            }
            _ => report.matched += 1,
        }
    }

    fn example(
        &self,
        report: &mut Report,
        kinds: &mut [usize; 6],
        kind: usize,
        found: Discrepancy,
    ) {
        if kinds[kind] < self.examples {
            kinds[kind] += 1;
            report.examples.push(found);
        }
    }
}

/// A callId's 64-bit hash: what the reconciliation keeps of each counterparty record. (Two callIds
/// sharing one would hide one "missing there": about one chance in 10¹³ for a day of 10⁶ records.)
fn fingerprint(call_id: &CallId) -> u64 {
    let mut h = DefaultHasher::new();
    call_id.as_str().hash(&mut h);
    h.finish()
}

/// The fields of a counterparty record, as files spell them.
#[derive(Deserialize)]
struct Row {
    call_id: String,
    status: String,
    #[serde(default)]
    amount: Option<i64>,
}

fn record_of(row: Row, record: u64) -> Result<RemoteRecord, ReadError> {
    let fail = |reason: String| ReadError { record, reason };
    let call_id: CallId = row
        .call_id
        .trim()
        .parse()
        .map_err(|e: crate::ParseCallIdError| fail(e.to_string()))?;
    let outcome = match row.status.trim().to_ascii_lowercase().as_str() {
        "succeeded" | "success" | "paid" | "ok" => RemoteOutcome::Succeeded,
        "failed" | "failure" | "declined" | "error" => RemoteOutcome::Failed,
        other => {
            return Err(fail(format!(
                "status `{other}` is neither succeeded (success, paid, ok) nor failed (failure, declined, error)"
            )))
        }
    };
    Ok(RemoteRecord {
        call_id,
        outcome,
        amount: row.amount,
    })
}

/// Reads JSON lines: one object per line with `call_id`, `status` (`succeeded`/`failed`, and the usual
/// synonyms) and an optional integer `amount`; blank lines are skipped.
pub fn read_jsonl(reader: impl BufRead) -> impl Iterator<Item = Result<RemoteRecord, ReadError>> {
    reader.lines().enumerate().filter_map(|(i, line)| {
        let record = i as u64 + 1;
        match line {
            Err(e) => Some(Err(ReadError {
                record,
                reason: e.to_string(),
            })),
            Ok(line) if line.trim().is_empty() => None,
            Ok(line) => Some(
                serde_json::from_str::<Row>(&line)
                    .map_err(|e| ReadError {
                        record,
                        reason: e.to_string(),
                    })
                    .and_then(|row| record_of(row, record)),
            ),
        }
    })
}

/// Reads CSV with a header row naming at least `call_id` and `status` (and optionally `amount`), in
/// any order, other columns ignored.
pub fn read_csv(reader: impl Read) -> impl Iterator<Item = Result<RemoteRecord, ReadError>> {
    csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(reader)
        .into_deserialize::<Row>()
        .enumerate()
        .map(|(i, row)| {
            let record = i as u64 + 1;
            row.map_err(|e| ReadError {
                record,
                reason: e.to_string(),
            })
            .and_then(|row| record_of(row, record))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_accept_both_spellings_and_report_bad_records() {
        let jsonl = "{\"call_id\": \"pay-1-00000000000000ff-api-7\", \"status\": \"SUCCESS\", \"amount\": 1250}\n\n{\"call_id\": \"nope\", \"status\": \"failed\"}\n{\"call_id\": \"pay-2-00000000000000fe-api-7\", \"status\": \"declined\"}\n";
        let read: Vec<_> = read_jsonl(jsonl.as_bytes()).collect();
        assert_eq!(read.len(), 3);
        let first = read[0].as_ref().unwrap();
        assert_eq!(
            (first.outcome, first.amount),
            (RemoteOutcome::Succeeded, Some(1250))
        );
        assert_eq!(read[1].as_ref().unwrap_err().record, 3);
        assert_eq!(read[2].as_ref().unwrap().outcome, RemoteOutcome::Failed);

        let csv = "status,amount,call_id,note\nsucceeded,1250,pay-1-00000000000000ff-api-7,x\nweird,,pay-2-00000000000000fe-api-7,\n";
        let read: Vec<_> = read_csv(csv.as_bytes()).collect();
        assert_eq!(read.len(), 2);
        assert_eq!(read[0].as_ref().unwrap().amount, Some(1250));
        let bad = read[1].as_ref().unwrap_err();
        assert_eq!(bad.record, 2);
        assert!(bad.reason.contains("weird"), "{bad}");
    }
}
