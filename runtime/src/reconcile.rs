//! Reconciliation: this side's receipts over a time range against the counterparty's records of the
//! same calls (a settlement file, an export), by callId or by business reference.
//!
//! Prevention (keys, callIds, lookups) never makes the other side's system perfect; a daily comparison
//! is the net under it. [`Reconciler::run`] reads the counterparty's records as a stream (a CSV or
//! JSON-lines reader is provided: [`read_csv`], [`read_jsonl`]), looks each one up here — by the
//! callId this side sent, or, with [`Reconciler::by_reference`], by the business reference (an order
//! id) that this side's idempotency key is made of — then walks this side's receipts of the range in
//! pages and reports those the other side never mentioned.
//!
//! # Memory
//!
//! Bounded by the day's size, not its content: one 64-bit hash per counterparty record (to find this
//! side's receipts it never mentioned; two by reference), one batch of counterparty records (1 000,
//! looked up at once: one statement on the SQL stores when matched by callId) and one page of receipts
//! at a time, and the first [`Reconciler::examples`] discrepancies of each kind. Counts are exact. A
//! day of 10⁶ records keeps about 16 MB of hashes (32 MB by reference).

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::{BufRead, Read};

use serde::Deserialize;

use crate::call_id::CallId;
use crate::error::Error;
use crate::key::Key;
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

/// One record of the counterparty: the call (by the callId sent to it, or by the business reference
/// both sides know it by), its outcome and, when the record has one, the amount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteRecord {
    /// The callId this side sent, when the counterparty kept it.
    pub call_id: Option<CallId>,
    /// The business reference (an order id), when the record has one: what
    /// [`Reconciler::by_reference`] matches on.
    pub reference: Option<String>,
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
        /// The call, as the counterparty's record names it.
        call_id: Option<CallId>,
        /// Its business reference, as the counterparty's record names it.
        reference: Option<String>,
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
type KeyOf = Box<dyn Fn(&str) -> Option<Key> + Send + Sync>;

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
    key_of: Option<KeyOf>,
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
            key_of: None,
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

    /// Matches the counterparty's records by their business reference instead of the callId: for a
    /// counterparty that never kept the callId, only its own copy of the order id. `key_of` names this
    /// side's idempotency key for a reference — the function's scope and the key parts the reference
    /// stands for, as the `#[idempotent]` function builds them — or `None` for a reference that
    /// cannot be one (reported unreadable). Every receipt state is found, `UNKNOWN` included, since
    /// the key is all it takes. A record without a reference is unreadable; one repeating a reference
    /// is counted in [`Report::repeated`]. Keys with a `window` cannot be rebuilt from a reference.
    ///
    /// Each record is one read of the store (a key is not a callId: no batched statement).
    ///
    /// ```
    /// # use samekey_runtime::reconcile::{read_csv, Reconciler};
    /// # use samekey_runtime::{store::ReceiptQuery, Key, Runtime};
    /// # async fn demo(rt: Runtime, day: ReceiptQuery) -> Result<(), samekey_runtime::Error> {
    /// // #[idempotent(key = "order_id", scope = "orders.charge")] async fn charge(order_id: &str, …)
    /// let file: &[u8] = b"reference,status,amount\nord-1001,paid,1250\n";
    /// let report = Reconciler::new(&rt, day)
    ///     .by_reference(|order_id| Some(Key::build("orders.charge", order_id)))
    ///     .run(read_csv(file))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn by_reference(
        mut self,
        key_of: impl Fn(&str) -> Option<Key> + Send + Sync + 'static,
    ) -> Reconciler {
        self.key_of = Some(Box::new(key_of));
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
        // The callIds of this side that the counterparty mentioned, as hashes.
        let mut seen: HashSet<u64> = HashSet::new();
        // By reference: the references read, as hashes (repeats are found by them).
        let mut references: HashSet<u64> = HashSet::new();
        // The counterparty's records are looked up a batch at a time (one statement on the SQL
        // stores), then compared in the file's order.
        let mut batch: Vec<(RemoteRecord, Option<Key>)> = Vec::with_capacity(LOOKUP_BATCH);
        let mut read = 0u64;
        let mut remote = remote.into_iter().peekable();
        while remote.peek().is_some() {
            batch.clear();
            for record in remote.by_ref() {
                read += 1;
                report.remote_records += u64::from(record.is_ok());
                match self.admit(record, read, &mut seen, &mut references) {
                    Admitted::Compare(record, key) => batch.push((record, key)),
                    Admitted::Repeated => report.repeated += 1,
                    Admitted::Unreadable(e) => {
                        report.unreadable += 1;
                        self.example(&mut report, &mut kinds, 5, Discrepancy::Unreadable(e));
                    }
                }
                if batch.len() == LOOKUP_BATCH {
                    break;
                }
            }
            let mut found = self.look_up(&batch).await?;
            for (record, key) in batch.drain(..) {
                let here = match (&key, &record.call_id) {
                    (Some(key), _) => found.remove(&key.to_hex()),
                    (None, Some(call_id)) => found.remove(call_id.as_str()),
                    (None, None) => None,
                };
                if let Some(here) = &here {
                    // Matched by reference, the record may repeat a call under another reference.
                    if key.is_some() && !seen.insert(fingerprint(&here.call_id)) {
                        report.repeated += 1;
                        continue;
                    }
                }
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

    /// Sorts one record of the counterparty's (the `ordinal`-th read): to compare (with this side's key
    /// for it, when matched by reference), a repeat, or unreadable.
    fn admit(
        &self,
        record: Result<RemoteRecord, ReadError>,
        ordinal: u64,
        seen: &mut HashSet<u64>,
        references: &mut HashSet<u64>,
    ) -> Admitted {
        let record = match record {
            Ok(record) => record,
            Err(e) => return Admitted::Unreadable(e),
        };
        let Some(key_of) = &self.key_of else {
            return match &record.call_id {
                Some(call_id) if seen.insert(fingerprint(call_id)) => {
                    Admitted::Compare(record, None)
                }
                Some(_) => Admitted::Repeated,
                None => Admitted::Unreadable(ReadError {
                    record: ordinal,
                    reason: "no call_id (to match by reference, see Reconciler::by_reference)"
                        .to_owned(),
                }),
            };
        };
        let Some(reference) = record.reference.as_deref() else {
            return Admitted::Unreadable(ReadError {
                record: ordinal,
                reason: "no reference to match by".to_owned(),
            });
        };
        let Some(key) = key_of(reference) else {
            return Admitted::Unreadable(ReadError {
                record: ordinal,
                reason: format!("reference `{reference}` names no key here"),
            });
        };
        if references.insert(fingerprint_of(reference)) {
            Admitted::Compare(record, Some(key))
        } else {
            Admitted::Repeated
        }
    }

    /// This side's receipts of a batch of records: by callId (one statement on the SQL stores) or by
    /// key (one read each), indexed by the callId's text or the key's hex digest.
    async fn look_up(
        &self,
        batch: &[(RemoteRecord, Option<Key>)],
    ) -> Result<HashMap<String, Receipt>, Error> {
        let store = self.rt.store();
        if self.key_of.is_none() {
            let ids: Vec<CallId> = batch
                .iter()
                .filter_map(|(r, _)| r.call_id.clone())
                .collect();
            return Ok(store
                .get_by_call_ids(&ids)
                .await?
                .into_iter()
                .map(|r| (r.call_id.as_str().to_owned(), r))
                .collect());
        }
        let mut found = HashMap::with_capacity(batch.len());
        for key in batch.iter().filter_map(|(_, key)| key.as_ref()) {
            if let Some(receipt) = store.get(key, self.rt.now_ms()).await? {
                found.insert(key.to_hex(), receipt);
            }
        }
        Ok(found)
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
                reference: record.reference,
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
                call_id: here.call_id,
                here: here.state,
                there: record.outcome,
            };
            self.example(report, kinds, 2, found);
            return;
        }
        let amounts = match (&self.amount, record.amount) {
            (Some(amount_of), Some(there)) if here.state == ReceiptState::Success => {
                amount_of(&here).map(|amount| (amount, there))
            }
            _ => None,
        };
        match amounts {
            Some((amount, there)) if amount != there => {
                report.amount_mismatches += 1;
                let found = Discrepancy::AmountMismatch {
                    call_id: here.call_id,
                    here: amount,
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
    fingerprint_of(call_id.as_str())
}

fn fingerprint_of(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// What becomes of one record of the counterparty's.
enum Admitted {
    /// Compared with this side's receipt (found by its callId, or by this key).
    Compare(RemoteRecord, Option<Key>),
    /// A call read before.
    Repeated,
    Unreadable(ReadError),
}

/// The fields of a counterparty record, as files spell them.
#[derive(Deserialize)]
struct Row {
    #[serde(default)]
    call_id: Option<String>,
    #[serde(default)]
    reference: Option<String>,
    status: String,
    #[serde(default)]
    amount: Option<i64>,
}

fn record_of(row: Row, record: u64) -> Result<RemoteRecord, ReadError> {
    let fail = |reason: String| ReadError { record, reason };
    // An empty CSV cell is no value.
    let given = |field: Option<String>| field.filter(|v| !v.trim().is_empty());
    let reference = given(row.reference).map(|r| r.trim().to_owned());
    let call_id: Option<CallId> = match given(row.call_id) {
        Some(id) => Some(
            id.trim()
                .parse()
                .map_err(|e: crate::ParseCallIdError| fail(e.to_string()))?,
        ),
        None if reference.is_some() => None,
        None => return Err(fail("neither a call_id nor a reference".to_owned())),
    };
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
        reference,
        outcome,
        amount: row.amount,
    })
}

/// Reads JSON lines: one object per line with `call_id` or `reference` (or both), `status`
/// (`succeeded`/`failed`, and the usual synonyms) and an optional integer `amount`; blank lines are
/// skipped.
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

/// Reads CSV with a header row naming `status` and `call_id` or `reference` (or both), and optionally
/// `amount`, in any order, other columns ignored; an empty cell is no value.
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

        let csv = "reference,call_id,status\nord-1,,paid\n,,paid\n";
        let read: Vec<_> = read_csv(csv.as_bytes()).collect();
        let by_reference = read[0].as_ref().unwrap();
        assert_eq!(
            (by_reference.reference.as_deref(), &by_reference.call_id),
            (Some("ord-1"), &None)
        );
        let neither = read[1].as_ref().unwrap_err();
        assert!(neither.reason.contains("neither"), "{neither}");
    }
}
