//! The matcher: [`Reconciler`] reads the counterparty's records, looks each one up here (by callId, a
//! batch at a time, or by the business reference the key is made of), compares outcomes and amounts,
//! then walks this side's receipts of the range for those the counterparty never mentioned. What it
//! keeps in memory is bounded as the module [`reconcile`](crate::reconcile) says.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::call_id::CallId;
use crate::error::Error;
use crate::key::Key;
use crate::receipt::{Receipt, ReceiptState};
use crate::reconcile::record::{ReadError, RemoteOutcome, RemoteRecord};
use crate::reconcile::report::{Discrepancy, ReconcileReport};
use crate::runtime::Runtime;
use crate::store::ReceiptQuery;

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
    /// is counted in [`ReconcileReport::repeated`]. Keys with a `window` cannot be rebuilt from a reference.
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
    ) -> Result<ReconcileReport, Error> {
        let store = self.rt.store();
        let mut report = ReconcileReport::default();
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
        report: &mut ReconcileReport,
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
        report: &mut ReconcileReport,
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
