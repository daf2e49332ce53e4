//! `samekey reconcile`: this side's receipts over a range against the counterparty's records, by
//! callId or by business reference, through the runtime's own [`Reconciler`].

use std::io::BufReader;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use samekey_runtime::reconcile::{
    read_csv, read_jsonl, Discrepancy, ReconcileReport, RemoteOutcome,
};
use samekey_runtime::{Receipt, Runtime};
use serde_json::{json, Value};

use crate::args::RangeArgs;
use crate::keys;
use crate::output::{outcome, Format, Out, Progress, Tone};
use crate::{Failure, Verdict};

#[derive(Clone, Copy, ValueEnum)]
enum FileFormat {
    Csv,
    Jsonl,
}

#[derive(Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    range: RangeArgs,
    /// The counterparty's records: CSV with a header (call_id or reference, status, optionally
    /// amount) or JSON lines ({"call_id": …, "status": "succeeded"|"failed", "amount": …}).
    #[arg(long)]
    remote: PathBuf,
    /// Match the records' `reference` (an order id) instead of their callIds, for a counterparty
    /// that never kept the callId: this side's key for a reference is the function's scope, SCOPE,
    /// with the parts given by --part.
    #[arg(long, value_name = "SCOPE")]
    by_reference: Option<String>,
    /// With --by-reference: a key part as TYPE:VALUE, in order, `{}` standing for the record's
    /// reference (default: one part, str:{}). E.g. --part u64:{} --part str:charge.
    #[arg(long, requires = "by_reference")]
    part: Vec<String>,
    /// The file's format (default: by its extension, .csv or .jsonl/.ndjson/.json).
    #[arg(long, value_enum)]
    format: Option<FileFormat>,
    /// Compare amounts too: where a successful receipt's stored outcome holds its amount, as a JSON
    /// pointer (`/amount`, `/charge/amount_minor`).
    #[arg(long)]
    amount: Option<String>,
    /// How many discrepancies of each kind to list (counts stay exact).
    #[arg(long, default_value_t = 20)]
    examples: usize,
}

pub async fn reconcile(
    rt: &Runtime,
    args: ReconcileArgs,
    out: &mut Out,
) -> Result<Verdict, Failure> {
    if args.range.node.is_some() {
        return Err(Failure::usage(
            "--node does not apply to reconcile: the counterparty's file holds every node's calls",
        ));
    }
    let query = args.range.query()?;
    let format = match args.format {
        Some(format) => format,
        None => match args.remote.extension().and_then(|e| e.to_str()) {
            Some("csv") => FileFormat::Csv,
            Some("jsonl" | "ndjson" | "json") => FileFormat::Jsonl,
            _ => {
                return Err(Failure::usage(format!(
                    "{}: say --format csv or --format jsonl (the extension does not tell)",
                    args.remote.display()
                )))
            }
        },
    };
    let file = std::fs::File::open(&args.remote)
        .map_err(|e| Failure::usage(format!("cannot read {}: {e}", args.remote.display())))?;
    let mut reconciler =
        samekey_runtime::reconcile::Reconciler::new(rt, query).examples(args.examples);
    if let Some(pointer) = args.amount.clone() {
        if !pointer.starts_with('/') {
            return Err(Failure::usage(format!(
                "--amount {pointer:?} is not a JSON pointer: write /amount or /charge/amount"
            )));
        }
        reconciler = reconciler.amount(move |r: &Receipt| outcome(r).pointer(&pointer)?.as_i64());
    }
    if let Some(scope) = args.by_reference.clone() {
        let parts = if args.part.is_empty() {
            vec!["str:{}".to_owned()]
        } else {
            args.part.clone()
        };
        if !parts.iter().any(|p| p.contains("{}")) {
            return Err(Failure::usage(
                "--part: one part must hold the reference, as {} (e.g. --part str:{})",
            ));
        }
        // Checked once up front (with the reference `0`): a wrong type or marker is a usage error,
        // not one unreadable record per line.
        keys::from_parts(&scope, &with_reference(&parts, "0")).map_err(Failure::usage)?;
        reconciler = reconciler.by_reference(move |reference| {
            keys::from_parts(&scope, &with_reference(&parts, reference)).ok()
        });
    }
    let by_reference = args.by_reference.is_some();
    let mut progress = Progress::new("reconcile: records read");
    let mut read = 0u64;
    let mut counted = |record| {
        read += 1;
        progress.tick(read);
        record
    };
    let report = match format {
        FileFormat::Csv => {
            let records = read_csv(BufReader::new(file)).map(&mut counted);
            reconciler.run(records).await
        }
        FileFormat::Jsonl => {
            let records = read_jsonl(BufReader::new(file)).map(&mut counted);
            reconciler.run(records).await
        }
    }
    .map_err(Failure::store)?;
    drop(progress);
    print(out, &report, by_reference);
    Ok(if report.is_clean() {
        Verdict::Done
    } else {
        Verdict::Found
    })
}

/// The key parts with `{}` standing for `reference`.
fn with_reference(parts: &[String], reference: &str) -> Vec<String> {
    parts.iter().map(|p| p.replace("{}", reference)).collect()
}

fn there(outcome: RemoteOutcome) -> &'static str {
    match outcome {
        RemoteOutcome::Succeeded => "succeeded",
        RemoteOutcome::Failed => "failed",
    }
}

fn discrepancy_json(d: &Discrepancy) -> Value {
    match d {
        Discrepancy::MissingHere { call_id, reference } => json!({
            "kind": "missing_here",
            "call_id": call_id.as_ref().map(ToString::to_string),
            "reference": reference,
        }),
        Discrepancy::MissingThere { call_id, state } => json!({
            "kind": "missing_there", "call_id": call_id.to_string(), "here": state.to_string(),
        }),
        Discrepancy::StateMismatch {
            call_id,
            here,
            there: outcome,
        } => json!({
            "kind": "state_mismatch", "call_id": call_id.to_string(), "here": here.to_string(),
            "there": there(*outcome),
        }),
        Discrepancy::AmountMismatch {
            call_id,
            here,
            there,
        } => json!({
            "kind": "amount_mismatch", "call_id": call_id.to_string(), "here": here, "there": there,
        }),
        Discrepancy::Unreadable(e) => {
            json!({ "kind": "unreadable", "record": e.record, "reason": e.reason })
        }
    }
}

fn counts_json(r: &ReconcileReport) -> Value {
    json!({
        "remote_records": r.remote_records,
        "receipts": r.receipts,
        "matched": r.matched,
        "missing_here": r.missing_here,
        "missing_there": r.missing_there,
        "state_mismatches": r.state_mismatches,
        "amount_mismatches": r.amount_mismatches,
        "unreadable": r.unreadable,
        "outside_query": r.outside_query,
        "repeated": r.repeated,
        "clean": r.is_clean(),
    })
}

fn print(out: &mut Out, report: &ReconcileReport, by_reference: bool) {
    match out.format() {
        Format::Json => {
            let mut doc = counts_json(report);
            doc["examples"] = report.examples.iter().map(discrepancy_json).collect();
            out.json(&doc);
        }
        Format::Jsonl => {
            for d in &report.examples {
                out.json(&discrepancy_json(d));
            }
            out.json(&json!({ "summary": counts_json(report) }));
        }
        Format::Table => {
            let rows = [
                ("counterparty records", report.remote_records, Tone::Dim),
                ("receipts here", report.receipts, Tone::Dim),
                ("matched", report.matched, Tone::Good),
                ("missing here", report.missing_here, Tone::Bad),
                ("missing there", report.missing_there, Tone::Bad),
                ("state mismatches", report.state_mismatches, Tone::Bad),
                ("amount mismatches", report.amount_mismatches, Tone::Bad),
                ("unreadable records", report.unreadable, Tone::Bad),
                ("outside the range", report.outside_query, Tone::Dim),
                (
                    if by_reference {
                        "repeated references"
                    } else {
                        "repeated callIds"
                    },
                    report.repeated,
                    Tone::Dim,
                ),
            ];
            for (what, n, tone) in rows {
                let tone = if n == 0 { Tone::Dim } else { tone };
                let n = out.paint(&n.to_string(), tone, 0);
                out.line(format!("{what:<22}{n}"));
            }
            if !report.examples.is_empty() {
                out.line("");
                for d in &report.examples {
                    out.line(format!("  {}", describe(d)));
                }
            }
            out.line("");
            if report.is_clean() {
                out.line(out.paint("clean: both sides agree", Tone::Good, 0));
            } else {
                out.line(out.paint("MISMATCH: see above", Tone::Bad, 0));
            }
        }
    }
}

fn describe(d: &Discrepancy) -> String {
    match d {
        Discrepancy::MissingHere { call_id, reference } => {
            let call = match (call_id, reference) {
                (Some(call_id), _) => call_id.to_string(),
                (None, Some(reference)) => format!("reference {reference}"),
                (None, None) => "a record".to_owned(),
            };
            format!("missing here     {call}: the counterparty has it, this side has no receipt")
        }
        Discrepancy::MissingThere { call_id, state } => {
            format!("missing there    {call_id}: {state} here, the counterparty never mentions it")
        }
        Discrepancy::StateMismatch {
            call_id,
            here,
            there: outcome,
        } => format!(
            "state mismatch   {call_id}: {here} here, {} there",
            there(*outcome)
        ),
        Discrepancy::AmountMismatch {
            call_id,
            here,
            there,
        } => format!("amount mismatch  {call_id}: {here} here, {there} there"),
        Discrepancy::Unreadable(e) => format!("unreadable       {e}"),
    }
}
