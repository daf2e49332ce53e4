//! `samekey`: what an operator asks a samekey store at 3 a.m. — what happened to this call, what the
//! store holds, what needs a person — and what they do about it, over any store URL (`sqlite:PATH`,
//! `postgres://…`, `mysql://…`, `redis://…`, a Redis Cluster as a comma-separated list), given by `--store` or
//! `SAMEKEY_STORE`.

mod args;
mod audit;
mod compensation;
mod inspect;
mod keys;
mod listing;
mod maintain;
mod output;
mod reconcile;
mod store;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use samekey_runtime::Runtime;

use crate::output::{Format, Out};

/// Inspect, audit and mend what a samekey store holds.
///
/// Exit status: 0 done (or clean), 1 findings (audit) or mismatches (reconcile), 2 a usage or input
/// error, 3 a store that cannot be reached or read, 4 a call or key the store does not know.
#[derive(Parser)]
#[command(name = "samekey", version, about, long_about)]
struct Cli {
    /// The store: `sqlite:PATH`, `postgres://USER@HOST/DB`, `mysql://USER@HOST/DB`, `redis://HOST:PORT`, or a Redis Cluster
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

    /// Times in this machine's time zone instead of UTC.
    #[arg(long, global = true)]
    local: bool,

    /// Judge as of this RFC 3339 time instead of now, where the store takes the caller's time
    /// (SQLite): for output that does not change with the day.
    #[arg(long, global = true, hide = true)]
    now: Option<String>,

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
    Inspect(args::CallArgs),

    /// Receipts as a table, by creation time, with filters and paging.
    ///
    /// Examples:
    ///   samekey ls --since 2h
    ///   samekey ls --state unknown --scope orders.charge
    ///   samekey ls --since 2026-11-30T00:00:00Z --until 2026-12-01T00:00:00Z --jsonl
    #[command(verbatim_doc_comment)]
    Ls(listing::LsArgs),

    /// Counts of receipts by state and scope.
    ///
    /// Examples:
    ///   samekey stats
    ///   samekey stats --since 24h --json
    #[command(verbatim_doc_comment)]
    Stats(args::RangeArgs),

    /// What should never happen or needs a person: a key that took effect more than once, a call
    /// stuck PROCESSING past its lease, an UNKNOWN older than a threshold, a MANUAL compensation, a
    /// journal with a gap. Exits 1 when it finds any (for cron or CI), 0 when the store is clean.
    ///
    /// Examples:
    ///   samekey audit
    ///   samekey audit --since 24h --unknown-older-than 15m
    ///   samekey audit --jsonl | jq 'select(.kind == "double_execution")'
    #[command(verbatim_doc_comment)]
    Audit(audit::AuditArgs),

    /// Work the compensation queue by hand: list it, show an entry, make it due now, resolve it,
    /// escalate it — journaled with who and why.
    ///
    /// Examples:
    ///   samekey compensation ls
    ///   samekey compensation show pay-1796104890822-7f28690e557c959e-demo
    ///   samekey compensation resolve pay-… --as succeeded --outcome '{"charge_id":"ch_1"}' --reason "on the provider's dashboard"
    #[command(verbatim_doc_comment, subcommand)]
    Compensation(compensation::CompensationCommand),

    /// This side's receipts over a time range against the counterparty's records (a CSV or JSON-lines
    /// file of call_id, status and optionally amount). Exits 1 when anything does not match.
    ///
    /// Examples:
    ///   samekey reconcile --since 2026-11-30T00:00:00Z --until 2026-12-01T00:00:00Z --remote settlement.csv
    ///   samekey reconcile --since 24h --scope payments.charge --remote export.jsonl --amount /amount
    ///   samekey reconcile --since 24h --remote bank.csv --by-reference orders.charge --part u64:{} --part str:charge
    #[command(verbatim_doc_comment)]
    Reconcile(reconcile::ReconcileArgs),

    /// Evict the receipts that expired (and journals past their keep); `--dry-run` counts them.
    ///
    /// Examples:
    ///   samekey purge --expired --dry-run
    ///   samekey purge --expired
    #[command(verbatim_doc_comment)]
    Purge(maintain::PurgeArgs),

    /// Forget a finished call, so that its key may be claimed again (a customer redoes an operation).
    /// Refused for a call PROCESSING (it may be running) or UNKNOWN (resolve it first); journaled with
    /// who and why.
    ///
    /// Examples:
    ///   samekey forget pay-1796104890822-7f28690e557c959e-demo --reason "ticket 4711"
    ///   samekey forget --scope orders.charge --part u64:42 --part str:charge --reason "ticket 4711"
    #[command(verbatim_doc_comment)]
    Forget(maintain::ForgetArgs),
}

/// How a command ended, when it did not fail.
pub enum Verdict {
    /// Done; nothing to report (exit 0).
    Done,
    /// Done, and it found what someone must look at (exit 1).
    Found,
}

/// A failure the operator reads: a message and an exit code (2 for a usage or input error, 3 for a
/// store that cannot be reached or read, 4 for a call or key the store does not know).
#[derive(Debug)]
pub struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: 2,
            message: message.into(),
        }
    }

    pub fn store(message: impl std::fmt::Display) -> Failure {
        Failure {
            code: 3,
            message: message.to_string(),
        }
    }

    pub fn unknown(message: impl Into<String>) -> Failure {
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
        Ok(Verdict::Done) => ExitCode::SUCCESS,
        Ok(Verdict::Found) => ExitCode::from(1),
        Err(failure) => {
            eprintln!("samekey: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

async fn run(cli: Cli) -> Result<Verdict, Failure> {
    let Some(url) = cli.store.clone() else {
        return Err(Failure::usage(
            "no store: give --store URL or set SAMEKEY_STORE (sqlite:PATH, postgres://…, mysql://…, redis://…)",
        ));
    };
    let format = if cli.json {
        Format::Json
    } else if cli.jsonl {
        Format::Jsonl
    } else {
        Format::Table
    };
    if let Some(now) = &cli.now {
        args::set_now(now)?;
    }
    let store = store::open(&url, &cli.redis_prefix).await?;
    let rt = Runtime::builder()
        .node("cli")
        .shared_store(store)
        .clock(args::CliClock)
        .build()
        .map_err(|e| Failure::usage(e.to_string()))?;
    let mut out = Out::new(format, cli.local);
    match cli.command {
        Command::Inspect(args) => inspect::inspect(&rt, args, &mut out).await,
        Command::Ls(args) => listing::ls(&rt, args, &mut out).await,
        Command::Stats(args) => listing::stats(&rt, args, &mut out).await,
        Command::Audit(args) => audit::audit(&rt, args, &mut out).await,
        Command::Compensation(command) => compensation::run(&rt, command, &mut out).await,
        Command::Reconcile(args) => reconcile::reconcile(&rt, args, &mut out).await,
        Command::Purge(args) => maintain::purge(&rt, args, &mut out).await,
        Command::Forget(args) => maintain::forget(&rt, args, &mut out).await,
    }
}
