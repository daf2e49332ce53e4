//! Arguments several commands share: a time range with filters, a call or key, who acts and why —
//! and how each is read, with a message that says what to write instead.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use samekey_runtime::store::{Cursor, ReceiptQuery};
use samekey_runtime::{CallId, Key, ReceiptState, Runtime};

use crate::{keys, Failure};

/// Receipts by creation time, scope and state.
#[derive(Args, Clone)]
pub struct RangeArgs {
    /// Created at or after: an RFC 3339 time (`2026-11-30T00:00:00Z`) or a time ago (`2h`, `7d`).
    #[arg(long, default_value = "30d")]
    pub since: String,
    /// Created before: an RFC 3339 time or a time ago (default: now).
    #[arg(long)]
    pub until: Option<String>,
    /// Only this scope.
    #[arg(long)]
    pub scope: Option<String>,
    /// Only these states (processing, unknown, success, failed, received), repeatable.
    #[arg(long)]
    pub state: Vec<String>,
    /// Only calls made by this node (the last field of their callIds).
    #[arg(long)]
    pub node: Option<String>,
}

/// A call, by its callId, its key's digest, or its key's scope and typed parts.
#[derive(Args, Clone)]
pub struct CallArgs {
    /// The callId.
    pub call_id: Option<String>,
    /// The key's digest (64 hex digits), instead of a callId.
    #[arg(long, conflicts_with_all = ["call_id", "scope"])]
    pub key: Option<String>,
    /// The key's scope, with its parts (`--part`), instead of a callId.
    #[arg(long, requires = "part", conflicts_with = "call_id")]
    pub scope: Option<String>,
    /// A key part as TYPE:VALUE, in order (str, bool, char, u8…u128, i8…i128): encoded as the runtime
    /// encodes it.
    #[arg(long)]
    pub part: Vec<String>,
}

/// What a call or key argument names.
pub enum Target {
    Call(CallId),
    Key(Key),
}

impl CallArgs {
    pub fn target(&self) -> Result<Target, Failure> {
        match (&self.call_id, &self.key, &self.scope) {
            (Some(call_id), _, _) => Ok(Target::Call(call_id_arg(call_id)?)),
            (None, Some(digest), _) => Ok(Target::Key(
                keys::from_digest(digest).map_err(Failure::usage)?,
            )),
            (None, None, Some(scope)) => Ok(Target::Key(
                keys::from_parts(scope, &self.part).map_err(Failure::usage)?,
            )),
            (None, None, None) => Err(Failure::usage(
                "which call? give a callId, --key DIGEST, or --scope S --part TYPE:VALUE …",
            )),
        }
    }

    /// The key the call holds (looked up by callId when a callId was given).
    pub async fn key(&self, rt: &Runtime) -> Result<Key, Failure> {
        match self.target()? {
            Target::Key(key) => Ok(key),
            Target::Call(call_id) => match rt.store().get_by_call_id(&call_id).await {
                Ok(Some(receipt)) => Ok(receipt.key),
                Ok(None) => Err(Failure::unknown(format!(
                    "the store holds no receipt of call {call_id} (never made here, given back, forgotten, or expired)"
                ))),
                Err(e) => Err(Failure::store(e)),
            },
        }
    }
}

/// Who acts, and why: journaled and logged with what they did.
#[derive(Args, Clone)]
pub struct WhyArgs {
    /// Why (journaled with the action: a ticket, what was checked).
    #[arg(long)]
    pub reason: String,
    /// Who (default: $USER).
    #[arg(long)]
    pub by: Option<String>,
}

impl WhyArgs {
    pub fn who(&self) -> String {
        self.by
            .clone()
            .or_else(|| std::env::var("USER").ok())
            .or_else(|| std::env::var("LOGNAME").ok())
            .filter(|who| !who.trim().is_empty())
            .unwrap_or_else(|| "samekey-cli".to_owned())
    }
}

/// "Now" as `--now` set it (for output that must not change with the day, as in tests).
static NOW: OnceLock<u64> = OnceLock::new();

/// Judges as of `text` (RFC 3339) instead of this machine's clock, where the store takes the
/// caller's time (SQLite); a store with a clock of its own judges by it.
pub fn set_now(text: &str) -> Result<(), Failure> {
    let at = humantime::parse_rfc3339_weak(text)
        .map_err(|_| Failure::usage(format!("--now {text:?} is not an RFC 3339 time")))?;
    let ms = at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let _ = NOW.set(ms);
    Ok(())
}

/// Unix ms now, by this machine's clock (or `--now`).
pub fn now_ms() -> u64 {
    if let Some(now) = NOW.get() {
        return *now;
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The runtime's clock: this machine's, or `--now`.
pub struct CliClock;

impl samekey_runtime::clock::Clock for CliClock {
    fn now_ms(&self) -> u64 {
        now_ms()
    }
}

/// The time the store judges leases and expiries by: its own clock where nodes share it.
pub async fn store_now(rt: &Runtime) -> Result<u64, Failure> {
    rt.store().now_ms(now_ms()).await.map_err(Failure::store)
}

pub fn call_id_arg(text: &str) -> Result<CallId, Failure> {
    text.parse()
        .map_err(|e| Failure::usage(format!("{text:?} is not a callId: {e}")))
}

/// A time argument: RFC 3339, or a duration ago (`2h`).
pub fn time_arg(text: &str, what: &str) -> Result<u64, Failure> {
    if let Ok(ago) = humantime::parse_duration(text) {
        return Ok(now_ms().saturating_sub(u64::try_from(ago.as_millis()).unwrap_or(u64::MAX)));
    }
    match humantime::parse_rfc3339_weak(text) {
        Ok(at) => Ok(at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))),
        Err(_) => Err(Failure::usage(format!(
            "--{what} {text:?} is neither an RFC 3339 time (2026-11-30T00:00:00Z) nor a time ago (2h, 7d)"
        ))),
    }
}

/// A duration argument (`90s`, `1h`).
pub fn duration_arg(text: &str, what: &str) -> Result<u64, Failure> {
    humantime::parse_duration(text)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .map_err(|_| Failure::usage(format!("--{what} {text:?} is not a duration (90s, 1h, 2d)")))
}

fn state_arg(text: &str) -> Result<ReceiptState, Failure> {
    text.to_ascii_uppercase().parse().map_err(|_| {
        Failure::usage(format!(
            "--state {text:?}: one of received, processing, unknown, success, failed"
        ))
    })
}

impl RangeArgs {
    /// Whether `--node` admits the receipt (the query's other filters run in the store).
    pub fn admits(&self, r: &samekey_runtime::Receipt) -> bool {
        self.node
            .as_deref()
            .is_none_or(|node| r.call_id.node() == node)
    }

    /// The query these arguments select (pages of 1 000).
    pub fn query(&self) -> Result<ReceiptQuery, Failure> {
        let since = time_arg(&self.since, "since")?;
        let until = match &self.until {
            Some(text) => time_arg(text, "until")?,
            // Receipts are stamped by the store's clock: a little ahead of this machine's is still
            // "now".
            None => now_ms() + Duration::from_secs(3600).as_millis() as u64,
        };
        if until <= since {
            return Err(Failure::usage("--until must be after --since"));
        }
        let mut query = ReceiptQuery::created_between(since, until).limit(1_000);
        if let Some(scope) = &self.scope {
            query = query.scope(scope.clone());
        }
        let states = self
            .state
            .iter()
            .map(|s| state_arg(s))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(query.states(states))
    }
}

/// A `next:` position a page printed.
pub fn cursor_arg(text: &str) -> Result<Cursor, Failure> {
    let invalid = || Failure::usage(format!("--after {text:?}: give the `next:` a page printed"));
    let (at, digest) = text.split_once(':').ok_or_else(invalid)?;
    let created_ms = at.parse().map_err(|_| invalid())?;
    let key = keys::from_digest(digest).map_err(|_| invalid())?;
    Ok(Cursor {
        created_ms,
        digest: *key.digest(),
    })
}
