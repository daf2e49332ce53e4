//! `samekey`: what an operator asks a samekey store at 3 a.m. — what happened to this call, what the
//! store holds — over any store URL (`sqlite:PATH`, `postgres://…`, `redis://…`, a Redis Cluster as
//! a comma-separated list), given by `--store` or `SAMEKEY_STORE`.

mod keys;
mod output;
mod store;

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand};
use samekey_runtime::store::{Cursor, ReceiptQuery};
use samekey_runtime::{CallId, ReceiptState, Runtime};

use crate::output::{Format, Out};

/// Inspect and list what a samekey store holds.
#[derive(Parser)]
#[command(name = "samekey", version, about, long_about = None)]
struct Cli {
    /// The store: `sqlite:PATH`, `postgres://USER@HOST/DB`, `redis://HOST:PORT`, or a Redis Cluster
    /// as `redis://A,redis://B,…`.
    #[arg(long, env = "SAMEKEY_STORE", global = true)]
    store: Option<String>,

    /// The key prefix of a Redis store.
    #[arg(long, default_value = "samekey", global = true)]
    redis_prefix: String,

    /// One JSON document instead of a table.
    #[arg(long, global = true, conflicts_with = "jsonl")]
    json: bool,

    /// JSON lines (one object per line) instead of a table.
    #[arg(long, global = true)]
    jsonl: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A call's receipt and timeline: every attempt, backoff, lookup, take-over, transition and
    /// compensation step, with times and nodes.
    ///
    /// Examples:
    ///   samekey inspect pay-1796104890822-7f28690e557c959e-demo
    ///   samekey inspect --key 3f9a…(64 hex digits)
    ///   samekey inspect --scope orders.charge --part u64:42 --part str:charge
    #[command(verbatim_doc_comment)]
    Inspect(InspectArgs),

    /// Receipts as a table, by creation time, with filters and paging.
    ///
    /// Examples:
    ///   samekey ls --since 2h
    ///   samekey ls --state unknown --scope orders.charge
    ///   samekey ls --since 2026-11-30T00:00:00Z --until 2026-12-01T00:00:00Z --jsonl
    #[command(verbatim_doc_comment)]
    Ls(LsArgs),

    /// Counts of receipts by state and scope.
    ///
    /// Examples:
    ///   samekey stats
    ///   samekey stats --since 24h --json
    #[command(verbatim_doc_comment)]
    Stats(RangeArgs),
}

#[derive(Args)]
struct InspectArgs {
    /// The callId.
    call_id: Option<String>,
    /// The key's digest (64 hex digits), instead of a callId.
    #[arg(long, conflicts_with_all = ["call_id", "scope"])]
    key: Option<String>,
    /// The key's scope, with its parts (`--part`), instead of a callId.
    #[arg(long, requires = "part", conflicts_with = "call_id")]
    scope: Option<String>,
    /// A key part as TYPE:VALUE, in order (str, bool, u8…u128, i8…i128): encoded as the runtime
    /// encodes it.
    #[arg(long)]
    part: Vec<String>,
}

#[derive(Args, Clone)]
struct RangeArgs {
    /// Created at or after: an RFC 3339 time (`2026-11-30T00:00:00Z`) or a time ago (`2h`, `7d`).
    #[arg(long, default_value = "30d")]
    since: String,
    /// Created before: an RFC 3339 time or a time ago (default: now).
    #[arg(long)]
    until: Option<String>,
    /// Only this scope.
    #[arg(long)]
    scope: Option<String>,
    /// Only these states (processing, unknown, success, failed, received), repeatable.
    #[arg(long)]
    state: Vec<String>,
}

#[derive(Args)]
struct LsArgs {
    #[command(flatten)]
    range: RangeArgs,
    /// At most this many receipts.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// Continue after this position (printed as `next:` at the end of a page).
    #[arg(long)]
    after: Option<String>,
}

/// A failure the operator reads: a message and an exit code (2 for a usage or input error, 3 for a
/// store that cannot be reached or read, 4 for a call or key the store does not know).
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: 2,
            message: message.into(),
        }
    }

    fn store(message: impl std::fmt::Display) -> Failure {
        Failure {
            code: 3,
            message: message.to_string(),
        }
    }

    fn unknown(message: impl Into<String>) -> Failure {
        Failure {
            code: 4,
            message: message.into(),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("samekey: cannot start: {e}");
            return ExitCode::from(3);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("samekey: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let Some(url) = cli.store.clone() else {
        return Err(Failure::usage(
            "no store: give --store URL or set SAMEKEY_STORE (sqlite:PATH, postgres://…, redis://…)",
        ));
    };
    let format = if cli.json {
        Format::Json
    } else if cli.jsonl {
        Format::Jsonl
    } else {
        Format::Table
    };
    let store = store::open(&url, &cli.redis_prefix).await?;
    let rt = Runtime::builder()
        .node("cli")
        .shared_store(store)
        .build()
        .map_err(|e| Failure::usage(e.to_string()))?;
    let mut out = Out::new(format);
    match cli.command {
        Command::Inspect(args) => inspect(&rt, args, &mut out).await,
        Command::Ls(args) => ls(&rt, args, &mut out).await,
        Command::Stats(args) => stats(&rt, args, &mut out).await,
    }
}

async fn inspect(rt: &Runtime, args: InspectArgs, out: &mut Out) -> Result<(), Failure> {
    let history = match (&args.call_id, &args.key, &args.scope) {
        (Some(call_id), _, _) => {
            let call_id: CallId = call_id
                .parse()
                .map_err(|e| Failure::usage(format!("not a callId: {e}")))?;
            let history = rt.history(&call_id).await.map_err(Failure::store)?;
            if history.receipt.is_none() && history.events.is_empty() {
                return Err(Failure::unknown(format!(
                    "the store knows no call {call_id} (never made here, given back and forgotten, or expired)"
                )));
            }
            history
        }
        (None, Some(digest), _) => {
            let key = keys::from_digest(digest).map_err(Failure::usage)?;
            known(rt.history_of_key(&key).await.map_err(Failure::store)?, &key)?
        }
        (None, None, Some(scope)) => {
            let key = keys::from_parts(scope, &args.part).map_err(Failure::usage)?;
            known(rt.history_of_key(&key).await.map_err(Failure::store)?, &key)?
        }
        (None, None, None) => {
            return Err(Failure::usage(
                "inspect what? give a callId, --key DIGEST, or --scope S --part TYPE:VALUE …",
            ))
        }
    };
    out.history(&history);
    Ok(())
}

fn known(
    history: samekey_runtime::History,
    key: &samekey_runtime::Key,
) -> Result<samekey_runtime::History, Failure> {
    if history.receipt.is_none() && history.events.is_empty() {
        return Err(Failure::unknown(format!(
            "the store holds nothing for key {}",
            key.to_hex()
        )));
    }
    Ok(history)
}

/// Unix ms now.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A time argument: RFC 3339, or a duration ago (`2h`).
fn time_arg(text: &str, what: &str) -> Result<u64, Failure> {
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

fn state_arg(text: &str) -> Result<ReceiptState, Failure> {
    text.to_ascii_uppercase().parse().map_err(|_| {
        Failure::usage(format!(
            "--state {text:?}: one of received, processing, unknown, success, failed"
        ))
    })
}

fn query(range: &RangeArgs) -> Result<ReceiptQuery, Failure> {
    let since = time_arg(&range.since, "since")?;
    let until = match &range.until {
        Some(text) => time_arg(text, "until")?,
        // Receipts are stamped by the store's clock: a little ahead of this machine's is still "now".
        None => now_ms() + Duration::from_secs(3600).as_millis() as u64,
    };
    let mut query = ReceiptQuery::created_between(since, until);
    if let Some(scope) = &range.scope {
        query = query.scope(scope.clone());
    }
    let states = range
        .state
        .iter()
        .map(|s| state_arg(s))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(query.states(states))
}

fn cursor_arg(text: &str) -> Result<Cursor, Failure> {
    let invalid = || Failure::usage(format!("--after {text:?}: give the `next:` a page printed"));
    let (at, digest) = text.split_once(':').ok_or_else(invalid)?;
    let created_ms = at.parse().map_err(|_| invalid())?;
    let key = keys::from_digest(digest).map_err(|_| invalid())?;
    Ok(Cursor {
        created_ms,
        digest: *key.digest(),
    })
}

async fn ls(rt: &Runtime, args: LsArgs, out: &mut Out) -> Result<(), Failure> {
    let mut query = query(&args.range)?.limit(args.limit.clamp(1, 1_000));
    if let Some(after) = &args.after {
        query = query.after(cursor_arg(after)?);
    }
    let mut listed = Vec::new();
    let mut next = None;
    // Filters may leave a page short: read on until the limit is reached or the range ends.
    loop {
        let page = rt
            .store()
            .list_receipts(&query, now_ms())
            .await
            .map_err(Failure::store)?;
        listed.extend(page.receipts);
        match page.next {
            Some(at) if listed.len() < args.limit => query = query.after(at),
            Some(at) => {
                next = Some(at);
                break;
            }
            None => break,
        }
    }
    if listed.len() > args.limit {
        next = listed.get(args.limit - 1).map(Cursor::of);
        listed.truncate(args.limit);
    }
    out.receipts(&listed, next);
    Ok(())
}

async fn stats(rt: &Runtime, range: RangeArgs, out: &mut Out) -> Result<(), Failure> {
    let mut query = query(&range)?.limit(1_000);
    let mut counts: std::collections::BTreeMap<(String, String), u64> = Default::default();
    loop {
        let page = rt
            .store()
            .list_receipts(&query, now_ms())
            .await
            .map_err(Failure::store)?;
        for r in &page.receipts {
            *counts
                .entry((r.key.scope().to_owned(), r.state.to_string()))
                .or_default() += 1;
        }
        match page.next {
            Some(at) => query = query.after(at),
            None => break,
        }
    }
    out.stats(&counts);
    Ok(())
}
