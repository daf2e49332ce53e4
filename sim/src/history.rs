//! [`History`]: what happened in one run, in order, with callIds written short (`c1`, `c2`, … in the
//! order they were first seen) so that two runs of one seed print the same text.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::sync::Mutex;

use tokio::time::Instant;

/// One thing that happened.
#[derive(Debug, Clone)]
pub struct Event {
    /// Milliseconds since the run began (the simulation's time).
    pub at_ms: u64,
    /// Who did it (`node1`, `gateway`, `broker`, `customer o3`, …).
    pub actor: String,
    /// What happened.
    pub what: String,
    /// The business keys (orders, messages) it concerns: what a shortened history keeps.
    pub subject: Option<String>,
}

/// The events of one run.
pub struct History {
    start: Instant,
    events: Mutex<Vec<Event>>,
    short: Mutex<HashMap<String, String>>,
}

impl History {
    /// An empty history whose clock starts now.
    pub fn new() -> History {
        History {
            start: Instant::now(),
            events: Mutex::new(Vec::new()),
            short: Mutex::new(HashMap::new()),
        }
    }

    /// Milliseconds since the run began.
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The short name of a callId (or any long id): `c1` for the first one seen, and so on.
    pub fn id(&self, long: &str) -> String {
        let mut short = self.short.lock().unwrap_or_else(|p| p.into_inner());
        let next = short.len() + 1;
        short
            .entry(long.to_owned())
            .or_insert_with(|| format!("c{next}"))
            .clone()
    }

    /// Records an event about `subject` (an order, a message), if any.
    pub fn log(&self, actor: impl Into<String>, subject: Option<&str>, what: impl Into<String>) {
        let event = Event {
            at_ms: self.now_ms(),
            actor: actor.into(),
            what: self.shorten(&what.into()),
            subject: subject.map(str::to_owned),
        };
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
    }

    /// `text` with every callId in it written short: the random part of a callId differs from run to
    /// run, its order of appearance does not.
    pub fn shorten(&self, text: &str) -> String {
        let id_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(start) = rest.find(id_char) {
            out.push_str(&rest[..start]);
            let token_len = rest[start..]
                .find(|c: char| !id_char(c))
                .unwrap_or(rest.len() - start);
            let token = &rest[start..start + token_len];
            if token.len() > 24 && token.parse::<samekey::CallId>().is_ok() {
                out.push_str(&self.id(token));
            } else {
                out.push_str(token);
            }
            rest = &rest[start + token_len..];
        }
        out.push_str(rest);
        out
    }

    /// How many events were recorded.
    pub fn len(&self) -> usize {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole history, one event a line.
    pub fn text(&self) -> String {
        self.render(None)
    }

    /// The events about `subjects` and the world-wide ones (crashes, pauses), one a line: a failing
    /// seed's history shortened to what its violations concern.
    pub fn shortened(&self, subjects: &BTreeSet<String>) -> String {
        self.render(Some(subjects))
    }

    fn render(&self, only: Option<&BTreeSet<String>>) -> String {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        for e in events.iter() {
            let keep = match (only, &e.subject) {
                (None, _) | (Some(_), None) => true,
                (Some(only), Some(s)) => only.contains(s),
            };
            if keep {
                let subject = e.subject.as_deref().unwrap_or("-");
                let _ = writeln!(
                    out,
                    "{:>9.3}s  {:<14} {:<8} {}",
                    e.at_ms as f64 / 1000.0,
                    e.actor,
                    subject,
                    e.what
                );
            }
        }
        out
    }
}

impl Default for History {
    fn default() -> History {
        History::new()
    }
}
