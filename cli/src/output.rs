//! What the command prints: tables for people, JSON (`--json`: one document) or JSON lines
//! (`--jsonl`) for machines. Times are UTC, RFC 3339, to the millisecond.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, UNIX_EPOCH};

use samekey_runtime::store::Cursor;
use samekey_runtime::{Event, History, Receipt};
use serde_json::{json, Value};

/// The output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Jsonl,
}

/// Where the command writes.
pub struct Out {
    format: Format,
    out: std::io::Stdout,
}

/// A time (Unix ms) as RFC 3339, UTC.
pub fn time(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

fn cursor(at: &Cursor) -> String {
    let hex: String = at.digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}:{hex}", at.created_ms)
}

fn outcome(receipt: &Receipt) -> Value {
    match receipt.outcome.as_deref() {
        None => Value::Null,
        Some(bytes) => serde_json::from_slice(bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned())),
    }
}

fn receipt_json(r: &Receipt) -> Value {
    json!({
        "call_id": r.call_id.to_string(),
        "scope": r.key.scope(),
        "key": r.key.to_hex(),
        "state": r.state.to_string(),
        "fence": r.fence.0,
        "created": time(r.created_ms),
        "updated": time(r.updated_ms),
        "lease_until": r.lease_until_ms.map(time),
        "expires_at": r.expires_at_ms.map(time),
        "outcome": outcome(r),
    })
}

fn event_json(e: &Event) -> Value {
    let mut value = serde_json::to_value(e).unwrap_or(Value::Null);
    if let Value::Object(fields) = &mut value {
        fields.insert("at".into(), Value::String(time(e.at_ms)));
        fields.insert("text".into(), Value::String(e.what.to_string()));
    }
    value
}

impl Out {
    pub fn new(format: Format) -> Out {
        Out {
            format,
            out: std::io::stdout(),
        }
    }

    fn line(&mut self, text: impl std::fmt::Display) {
        // A closed pipe (`| head`) ends the output, not the command with a panic.
        let _ = writeln!(self.out, "{text}");
    }

    /// A call's (or a key's) receipt and timeline.
    pub fn history(&mut self, history: &History) {
        let timeline = history.timeline();
        match self.format {
            Format::Json => {
                let doc = json!({
                    "receipt": history.receipt.as_ref().map(receipt_json),
                    "timeline": timeline.iter().map(event_json).collect::<Vec<_>>(),
                });
                self.line(serde_json::to_string_pretty(&doc).unwrap_or_default());
            }
            Format::Jsonl => {
                if let Some(r) = &history.receipt {
                    self.line(json!({ "receipt": receipt_json(r) }));
                }
                for e in &timeline {
                    self.line(event_json(e));
                }
            }
            Format::Table => {
                match &history.receipt {
                    Some(r) => {
                        self.line(format!("call      {}", r.call_id));
                        self.line(format!("key       {} {}", r.key.scope(), r.key.to_hex()));
                        self.line(format!("state     {} (fence {})", r.state, r.fence.0));
                        self.line(format!("created   {}", time(r.created_ms)));
                        self.line(format!("updated   {}", time(r.updated_ms)));
                        if let Some(until) = r.lease_until_ms {
                            self.line(format!("lease     until {}", time(until)));
                        }
                        if let Some(at) = r.expires_at_ms {
                            self.line(format!("expires   {}", time(at)));
                        }
                        let outcome = outcome(r);
                        if !outcome.is_null() {
                            self.line(format!("outcome   {outcome}"));
                        }
                    }
                    None => self.line("receipt   none (given back, or expired)"),
                }
                self.line("");
                self.line("timeline");
                let start = timeline.first().map_or(0, |e| e.at_ms);
                for e in &timeline {
                    let offset = e.at_ms.saturating_sub(start) as f64 / 1000.0;
                    self.line(format!(
                        "  {}  +{offset:>8.3}s  {:<12} {}",
                        time(e.at_ms),
                        e.node,
                        e.what
                    ));
                }
            }
        }
    }

    /// A page of receipts, and where the next one starts.
    pub fn receipts(&mut self, receipts: &[Receipt], next: Option<Cursor>) {
        match self.format {
            Format::Json => {
                let doc = json!({
                    "receipts": receipts.iter().map(receipt_json).collect::<Vec<_>>(),
                    "next": next.as_ref().map(cursor),
                });
                self.line(serde_json::to_string_pretty(&doc).unwrap_or_default());
            }
            Format::Jsonl => {
                for r in receipts {
                    self.line(receipt_json(r));
                }
            }
            Format::Table => {
                self.line(format!(
                    "{:<24}  {:<10}  {:<24}  {:<48}  KEY",
                    "CREATED", "STATE", "SCOPE", "CALL ID"
                ));
                for r in receipts {
                    self.line(format!(
                        "{:<24}  {:<10}  {:<24}  {:<48}  {}",
                        time(r.created_ms),
                        r.state.to_string(),
                        r.key.scope(),
                        r.call_id.to_string(),
                        &r.key.to_hex()[..16]
                    ));
                }
                match next {
                    Some(at) => self.line(format!("next: --after {}", cursor(&at))),
                    None => self.line(format!("({} receipts)", receipts.len())),
                }
            }
        }
    }

    /// Counts by scope and state.
    pub fn stats(&mut self, counts: &BTreeMap<(String, String), u64>) {
        match self.format {
            Format::Json | Format::Jsonl => {
                let rows: Vec<Value> = counts
                    .iter()
                    .map(
                        |((scope, state), n)| json!({ "scope": scope, "state": state, "count": n }),
                    )
                    .collect();
                if self.format == Format::Json {
                    let total: u64 = counts.values().sum();
                    let doc = json!({ "counts": rows, "total": total });
                    self.line(serde_json::to_string_pretty(&doc).unwrap_or_default());
                } else {
                    for row in rows {
                        self.line(row);
                    }
                }
            }
            Format::Table => {
                self.line(format!("{:<32}  {:<10}  {:>10}", "SCOPE", "STATE", "COUNT"));
                for ((scope, state), n) in counts {
                    self.line(format!("{scope:<32}  {state:<10}  {n:>10}"));
                }
                let total: u64 = counts.values().sum();
                self.line(format!("{:<32}  {:<10}  {total:>10}", "total", ""));
            }
        }
    }
}
