//! The readers of the counterparty's files: JSON lines ([`read_jsonl`]) and CSV ([`read_csv`], feature
//! `csv`, so that a build which reads no CSV does not compile a CSV parser). Both read the same fields
//! and yield one [`RemoteRecord`] (or a [`ReadError`]) per record, lazily.

use std::io::BufRead;
#[cfg(feature = "csv")]
use std::io::Read;

use serde::Deserialize;

use crate::call_id::CallId;
use crate::reconcile::record::{ReadError, RemoteOutcome, RemoteRecord};

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
                .map_err(|e: crate::call_id::ParseCallIdError| fail(e.to_string()))?,
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

#[cfg(feature = "csv")]
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
    fn jsonl_reader_accepts_both_spellings_and_reports_bad_records() {
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
    }

    #[cfg(feature = "csv")]
    #[test]
    fn csv_reader_accepts_both_spellings_and_reports_bad_records() {
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
