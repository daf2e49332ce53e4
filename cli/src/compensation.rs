//! `samekey compensation`: the queue of calls whose outcome nobody established, worked by hand. Every
//! change goes through the runtime's own [`Compensator`] (fenced against the workers, journaled and
//! logged with who and why).

use clap::{Args, Subcommand, ValueEnum};
use samekey_runtime::{
    compensation::CompensationEntry, compensation::CompensationState,
    compensation::ManualResolution, store::StoreError, CallId, Compensator, Error, Runtime,
};
use serde_json::{json, Value};

use crate::args::{call_id_arg, store_now, WhyArgs};
use crate::output::{Format, Out};
use crate::{Failure, Verdict};

#[derive(Subcommand)]
pub enum CompensationCommand {
    /// The queued entries, oldest first: pending, taken by a worker, or MANUAL.
    ///
    /// Examples:
    ///   samekey compensation ls
    ///   samekey compensation ls --manual --json
    #[command(verbatim_doc_comment)]
    Ls {
        /// Only the entries waiting for a person.
        #[arg(long)]
        manual: bool,
    },
    /// One entry: why it was queued, its rounds, its attempts and last error, its inputs, and the
    /// call's receipt and timeline.
    ///
    /// Example:
    ///   samekey compensation show pay-1796104890822-7f28690e557c959e-demo
    #[command(verbatim_doc_comment)]
    Show {
        /// The entry's callId.
        call_id: String,
    },
    /// Make an entry due now: a MANUAL one gets one more round from the workers.
    ///
    /// Example:
    ///   samekey compensation retry pay-… --reason "provider's status page is green again"
    #[command(verbatim_doc_comment)]
    Retry(ByHand),
    /// Decide an entry: record the call's outcome (succeeded, with the value duplicates will replay;
    /// failed) or give its key back (released: it never happened), then remove the entry.
    ///
    /// Examples:
    ///   samekey compensation resolve pay-… --as succeeded --outcome '{"charge_id":"ch_1"}' --reason "on the provider's dashboard"
    ///   samekey compensation resolve pay-… --as failed --reason "provider confirms: declined"
    ///   samekey compensation resolve pay-… --as released --reason "provider never received it"
    #[command(verbatim_doc_comment)]
    Resolve(ResolveArgs),
    /// Mark an entry MANUAL before its rounds run out.
    ///
    /// Example:
    ///   samekey compensation escalate pay-… --reason "provider asks for a ticket"
    #[command(verbatim_doc_comment)]
    Escalate(ByHand),
}

#[derive(Args)]
pub struct ByHand {
    /// The entry's callId.
    call_id: String,
    #[command(flatten)]
    why: WhyArgs,
}

#[derive(Clone, Copy, ValueEnum)]
enum Decision {
    Succeeded,
    Failed,
    Released,
}

#[derive(Args)]
pub struct ResolveArgs {
    /// The entry's callId.
    call_id: String,
    /// What became of the call.
    #[arg(long = "as", value_enum)]
    decision: Decision,
    /// With `--as succeeded`: the outcome duplicates will replay, as JSON (what the function would
    /// have returned).
    #[arg(long, required_if_eq("decision", "succeeded"))]
    outcome: Option<String>,
    /// With `--as failed`: the failure's message (default: the reason).
    #[arg(long)]
    message: Option<String>,
    #[command(flatten)]
    why: WhyArgs,
}

pub async fn run(
    rt: &Runtime,
    command: CompensationCommand,
    out: &mut Out,
) -> Result<Verdict, Failure> {
    let worker = Compensator::new(rt);
    match command {
        CompensationCommand::Ls { manual } => {
            let mut entries = queue(rt).await?;
            if manual {
                entries.retain(|e| e.state == CompensationState::Manual);
            }
            let now = store_now(rt).await?;
            list(out, &entries, now);
        }
        CompensationCommand::Show { call_id } => {
            let call_id = call_id_arg(&call_id)?;
            let entry = queued(rt, &call_id).await?;
            let history = rt.history(&call_id).await.map_err(Failure::store)?;
            show(out, &entry, &history);
        }
        CompensationCommand::Retry(args) => {
            let call_id = call_id_arg(&args.call_id)?;
            worker
                .retry(&call_id, &args.why.who(), &args.why.reason)
                .await
                .map_err(|e| refused(e, &call_id))?;
            done(
                out,
                &call_id,
                "retry",
                "due now: the next worker pass takes it",
            );
        }
        CompensationCommand::Escalate(args) => {
            let call_id = call_id_arg(&args.call_id)?;
            worker
                .escalate(&call_id, &args.why.who(), &args.why.reason)
                .await
                .map_err(|e| refused(e, &call_id))?;
            done(out, &call_id, "escalate", "MANUAL: it waits for a person");
        }
        CompensationCommand::Resolve(args) => {
            let call_id = call_id_arg(&args.call_id)?;
            let (resolution, what) = match args.decision {
                Decision::Succeeded => {
                    let text = args.outcome.as_deref().unwrap_or("null");
                    let value: Value = serde_json::from_str(text).map_err(|e| {
                        Failure::usage(format!("--outcome {text:?} is not JSON: {e}"))
                    })?;
                    (
                        ManualResolution::Succeeded(value),
                        "recorded SUCCESS: duplicates replay the outcome",
                    )
                }
                Decision::Failed => (
                    ManualResolution::Failed(
                        args.message.unwrap_or_else(|| args.why.reason.clone()),
                    ),
                    "recorded FAILED: duplicates get the failure",
                ),
                Decision::Released => (
                    ManualResolution::Release,
                    "key given back: a new call on it runs",
                ),
            };
            worker
                .resolve(&call_id, resolution, &args.why.who(), &args.why.reason)
                .await
                .map_err(|e| refused(e, &call_id))?;
            done(out, &call_id, "resolve", what);
        }
    }
    Ok(Verdict::Done)
}

async fn queue(rt: &Runtime) -> Result<Vec<CompensationEntry>, Failure> {
    rt.compensations().await.map_err(Failure::store)
}

async fn queued(rt: &Runtime, call_id: &CallId) -> Result<CompensationEntry, Failure> {
    queue(rt)
        .await?
        .into_iter()
        .find(|e| &e.call_id == call_id)
        .ok_or_else(|| Failure::unknown(format!("no compensation entry for call {call_id}")))
}

/// A refusal as the operator reads it.
fn refused(e: Error, call_id: &CallId) -> Failure {
    match e {
        Error::Store(StoreError::NotFound) => {
            Failure::unknown(format!("no compensation entry for call {call_id}"))
        }
        Error::InProgress { .. } => Failure::usage(format!(
            "a worker holds the entry of call {call_id} now (or a running call holds its key): try again once its lease ends"
        )),
        Error::Store(e) => Failure::store(e),
        e => Failure::usage(e.to_string()),
    }
}

fn state_name(entry: &CompensationEntry) -> &'static str {
    match entry.state {
        CompensationState::Pending => "PENDING",
        CompensationState::Taken { .. } => "TAKEN",
        CompensationState::Manual => "MANUAL",
    }
}

fn entry_json(out: &Out, e: &CompensationEntry) -> Value {
    let lease_until = match e.state {
        CompensationState::Taken { lease_until_ms } => Some(out.time(lease_until_ms)),
        _ => None,
    };
    json!({
        "call_id": e.call_id.to_string(),
        "scope": e.key.scope(),
        "key": e.key.to_hex(),
        "state": state_name(e),
        "round": e.round,
        "attempts": e.attempts,
        "last_error": e.last_error,
        "reason": e.reason,
        "queued": out.time(e.enqueued_ms),
        "next_at": out.time(e.next_at_ms),
        "lease_until": lease_until,
        "inputs": e.inputs::<Value>().and_then(Result::ok),
    })
}

fn list(out: &mut Out, entries: &[CompensationEntry], now: u64) {
    match out.format() {
        Format::Json => {
            let doc = json!({
                "entries": entries.iter().map(|e| entry_json(out, e)).collect::<Vec<_>>(),
            });
            out.json(&doc);
        }
        Format::Jsonl => {
            for e in entries {
                let line = entry_json(out, e);
                out.json(&line);
            }
        }
        Format::Table => {
            out.line(format!(
                "{:<8}  {:<48}  {:<20}  {:>5}  {:>8}  {:<10}  {:<29}  REASON",
                "STATE", "CALL ID", "SCOPE", "ROUND", "ATTEMPTS", "LAST", "NEXT"
            ));
            for e in entries {
                let state = out.state(state_name(e), 8);
                let last = e
                    .last_error
                    .map(|o| serde_json::to_value(o).unwrap_or_default())
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_else(|| "-".into());
                let next = match e.state {
                    CompensationState::Manual => "a person".to_owned(),
                    CompensationState::Taken { lease_until_ms } => {
                        format!("worker until {}", out.time(lease_until_ms))
                    }
                    CompensationState::Pending if e.next_at_ms <= now => "now".to_owned(),
                    CompensationState::Pending => out.time(e.next_at_ms),
                };
                out.line(format!(
                    "{state}  {:<48}  {:<20}  {:>5}  {:>8}  {last:<10}  {next:<29}  {}",
                    e.call_id.to_string(),
                    e.key.scope(),
                    e.round,
                    e.attempts,
                    e.reason
                ));
            }
            out.line(format!("({} entries)", entries.len()));
        }
    }
}

fn show(out: &mut Out, entry: &CompensationEntry, history: &samekey_runtime::journal::CallHistory) {
    match out.format() {
        Format::Json | Format::Jsonl => {
            let doc = json!({
                "entry": entry_json(out, entry),
                "receipt": history.receipt.as_ref().map(|r| out.receipt_json(r)),
                "timeline": history.timeline().iter().map(|e| out.event_json(e)).collect::<Vec<_>>(),
            });
            out.json(&doc);
        }
        Format::Table => {
            let value = entry_json(out, entry);
            let state = out.state(state_name(entry), 0);
            out.line(format!("entry     {state}, round {}", entry.round));
            out.line(format!("reason    {}", entry.reason));
            out.line(format!("queued    {}", out.time(entry.enqueued_ms)));
            out.line(format!("next      {}", out.time(entry.next_at_ms)));
            out.line(format!(
                "attempts  {} (last: {})",
                entry.attempts,
                value["last_error"].as_str().unwrap_or("-")
            ));
            if !value["inputs"].is_null() {
                out.line(format!("inputs    {}", value["inputs"]));
            }
            out.line("");
            match &history.receipt {
                Some(r) => out.receipt_lines(r),
                None => out.line("receipt   none (given back, forgotten, or expired)"),
            }
            out.line("");
            out.timeline_lines(&history.timeline());
        }
    }
}

fn done(out: &mut Out, call_id: &CallId, action: &str, what: &str) {
    match out.format() {
        Format::Table => out.line(format!("{call_id}: {what}")),
        _ => {
            let doc = json!({ "call_id": call_id.to_string(), "action": action, "result": what });
            out.json(&doc);
        }
    }
}
