//! What the command prints: tables for people, JSON (`--json`: one document) or JSON lines
//! (`--jsonl`) for machines. Times are RFC 3339 to the millisecond, UTC unless `--local`. Colours
//! only on a terminal (and never with `NO_COLOR` set); progress, on long scans, only on a terminal's
//! stderr.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant, UNIX_EPOCH};

use samekey_runtime::store::Cursor;
use samekey_runtime::{journal::CallHistory, journal::Event, Receipt};
use serde_json::{json, Value};

/// The output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Jsonl,
}

/// A colour for what a person should notice.
#[derive(Debug, Clone, Copy)]
pub enum Tone {
    Good,
    Warn,
    Bad,
    Dim,
}

/// Where the command writes, and how.
pub struct Out {
    format: Format,
    local: bool,
    colour: bool,
    out: std::io::Stdout,
}

fn cursor(at: &Cursor) -> String {
    let hex: String = at.digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}:{hex}", at.created_ms)
}

/// A stored outcome as JSON (or as text, when it is not JSON).
pub fn outcome(receipt: &Receipt) -> Value {
    match receipt.outcome.as_deref() {
        None => Value::Null,
        Some(bytes) => serde_json::from_slice(bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned())),
    }
}

/// The tone of a state's name.
pub fn tone_of(state: &str) -> Tone {
    match state {
        "SUCCESS" => Tone::Good,
        "UNKNOWN" | "PROCESSING" | "RECEIVED" | "PENDING" | "TAKEN" => Tone::Warn,
        "FAILED" | "MANUAL" => Tone::Bad,
        _ => Tone::Dim,
    }
}

impl Out {
    pub fn new(format: Format, local: bool) -> Out {
        let colour = format == Format::Table
            && std::io::stdout().is_terminal()
            && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        Out {
            format,
            local,
            colour,
            out: std::io::stdout(),
        }
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn line(&mut self, text: impl std::fmt::Display) {
        // A closed pipe (`| head`) ends the output, not the command with a panic.
        let _ = writeln!(self.out, "{text}");
    }

    /// A JSON value: pretty for `--json`, one line for `--jsonl`.
    pub fn json(&mut self, value: &Value) {
        let text = match self.format {
            Format::Json => serde_json::to_string_pretty(value).unwrap_or_default(),
            _ => value.to_string(),
        };
        self.line(text);
    }

    /// `text` in `tone`, on a terminal; padded to `width` before the colour codes, so columns align.
    pub fn paint(&self, text: &str, tone: Tone, width: usize) -> String {
        let padded = format!("{text:<width$}");
        if !self.colour {
            return padded;
        }
        let code = match tone {
            Tone::Good => "32",
            Tone::Warn => "33",
            Tone::Bad => "31;1",
            Tone::Dim => "2",
        };
        format!("\x1b[{code}m{padded}\x1b[0m")
    }

    /// A state's name, coloured by what it means.
    pub fn state(&self, state: &str, width: usize) -> String {
        self.paint(state, tone_of(state), width)
    }

    /// A time (Unix ms) as RFC 3339: UTC, or this machine's zone with `--local`.
    pub fn time(&self, ms: u64) -> String {
        if self.local {
            let local = i64::try_from(ms)
                .ok()
                .and_then(chrono::DateTime::from_timestamp_millis)
                .map(|t| t.with_timezone(&chrono::Local));
            if let Some(local) = local {
                return local.to_rfc3339_opts(chrono::SecondsFormat::Millis, false);
            }
        }
        humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
    }

    pub fn receipt_json(&self, r: &Receipt) -> Value {
        json!({
            "call_id": r.call_id.to_string(),
            "scope": r.key.scope(),
            "key": r.key.to_hex(),
            "state": r.state.to_string(),
            "fence": r.fence.0,
            "created": self.time(r.created_ms),
            "updated": self.time(r.updated_ms),
            "lease_until": r.lease_until_ms.map(|t| self.time(t)),
            "expires_at": r.expires_at_ms.map(|t| self.time(t)),
            "outcome": outcome(r),
        })
    }

    pub fn event_json(&self, e: &Event) -> Value {
        let mut value = serde_json::to_value(e).unwrap_or(Value::Null);
        if let Value::Object(fields) = &mut value {
            fields.insert("at".into(), Value::String(self.time(e.at_ms)));
            fields.insert("text".into(), Value::String(e.what.to_string()));
        }
        value
    }

    /// A receipt's fields, one per line, for people.
    pub fn receipt_lines(&mut self, r: &Receipt) {
        self.line(format!("call      {}", r.call_id));
        self.line(format!("key       {} {}", r.key.scope(), r.key.to_hex()));
        let state = self.state(&r.state.to_string(), 0);
        self.line(format!("state     {state} (fence {})", r.fence.0));
        self.line(format!("created   {}", self.time(r.created_ms)));
        self.line(format!("updated   {}", self.time(r.updated_ms)));
        if let Some(until) = r.lease_until_ms {
            self.line(format!("lease     until {}", self.time(until)));
        }
        if let Some(at) = r.expires_at_ms {
            self.line(format!("expires   {}", self.time(at)));
        }
        let outcome = outcome(r);
        if !outcome.is_null() {
            self.line(format!("outcome   {outcome}"));
        }
    }

    /// A timeline, for people: each event's time, its offset from the first, its node and text.
    pub fn timeline_lines(&mut self, timeline: &[Event]) {
        self.line("timeline");
        let start = timeline.first().map_or(0, |e| e.at_ms);
        for e in timeline {
            let offset = e.at_ms.saturating_sub(start) as f64 / 1000.0;
            self.line(format!(
                "  {}  +{offset:>8.3}s  {:<12} {}",
                self.time(e.at_ms),
                e.node,
                e.what
            ));
        }
    }

    /// A call's (or a key's) receipt and timeline.
    pub fn history(&mut self, history: &CallHistory) {
        let timeline = history.timeline();
        match self.format {
            Format::Json => {
                let doc = json!({
                    "receipt": history.receipt.as_ref().map(|r| self.receipt_json(r)),
                    "timeline": timeline.iter().map(|e| self.event_json(e)).collect::<Vec<_>>(),
                });
                self.json(&doc);
            }
            Format::Jsonl => {
                if let Some(r) = &history.receipt {
                    let line = json!({ "receipt": self.receipt_json(r) });
                    self.json(&line);
                }
                for e in &timeline {
                    let line = self.event_json(e);
                    self.json(&line);
                }
            }
            Format::Table => {
                match &history.receipt {
                    Some(r) => self.receipt_lines(r),
                    None => self.line("receipt   none (given back, forgotten, or expired)"),
                }
                self.line("");
                self.timeline_lines(&timeline);
            }
        }
    }

    /// A page of receipts, and where the next one starts.
    pub fn receipts(&mut self, receipts: &[Receipt], next: Option<Cursor>) {
        match self.format {
            Format::Json => {
                let doc = json!({
                    "receipts": receipts.iter().map(|r| self.receipt_json(r)).collect::<Vec<_>>(),
                    "next": next.as_ref().map(cursor),
                });
                self.json(&doc);
            }
            Format::Jsonl => {
                for r in receipts {
                    let line = self.receipt_json(r);
                    self.json(&line);
                }
            }
            Format::Table => {
                self.line(format!(
                    "{:<29}  {:<10}  {:<24}  {:<48}  KEY",
                    "CREATED", "STATE", "SCOPE", "CALL ID"
                ));
                for r in receipts {
                    let state = self.state(&r.state.to_string(), 10);
                    self.line(format!(
                        "{:<29}  {state}  {:<24}  {:<48}  {}",
                        self.time(r.created_ms),
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
        let rows = counts
            .iter()
            .map(|((scope, state), n)| json!({ "scope": scope, "state": state, "count": n }));
        let total: u64 = counts.values().sum();
        match self.format {
            Format::Json => {
                let doc = json!({ "counts": rows.collect::<Vec<_>>(), "total": total });
                self.json(&doc);
            }
            Format::Jsonl => {
                for row in rows {
                    self.json(&row);
                }
            }
            Format::Table => {
                self.line(format!("{:<32}  {:<10}  {:>10}", "SCOPE", "STATE", "COUNT"));
                for ((scope, state), n) in counts {
                    let state = self.state(state, 10);
                    self.line(format!("{scope:<32}  {state}  {n:>10}"));
                }
                self.line(format!("{:<32}  {:<10}  {total:>10}", "total", ""));
            }
        }
    }
}

/// Progress of a long scan, on stderr when it is a terminal (never in a pipe or a log): a count,
/// rewritten in place at most five times a second, cleared when the scan ends.
pub struct Progress {
    what: &'static str,
    shown: Option<Instant>,
    on: bool,
}

impl Progress {
    pub fn new(what: &'static str) -> Progress {
        Progress {
            what,
            shown: None,
            on: std::io::stderr().is_terminal(),
        }
    }

    pub fn tick(&mut self, done: u64) {
        if !self.on
            || self
                .shown
                .is_some_and(|at| at.elapsed() < Duration::from_millis(200))
        {
            return;
        }
        self.shown = Some(Instant::now());
        let _ = write!(std::io::stderr(), "\r{}: {done} …", self.what);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if self.shown.is_some() {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}
