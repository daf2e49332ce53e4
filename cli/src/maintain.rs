//! `samekey purge` and `samekey forget`: what an operator removes, and only that.

use clap::Args;
use samekey_runtime::{store::StoreError, Error, Runtime};
use serde_json::json;

use crate::args::{store_now, CallArgs, WhyArgs};
use crate::output::{Format, Out};
use crate::{Failure, Verdict};

#[derive(Args)]
pub struct PurgeArgs {
    /// Evict the receipts that expired (required: the only thing purge removes).
    #[arg(long, required = true)]
    expired: bool,
    /// Count what would be evicted; evict nothing.
    #[arg(long)]
    dry_run: bool,
}

pub async fn purge(rt: &Runtime, args: PurgeArgs, out: &mut Out) -> Result<Verdict, Failure> {
    debug_assert!(args.expired);
    let now = store_now(rt).await?;
    let store = rt.store();
    let (count, what) = if args.dry_run {
        let count = store.count_expired(now).await.map_err(Failure::store)?;
        (
            count,
            "expired receipts would be evicted (dry run: nothing was)",
        )
    } else {
        let count = store.purge_expired(now).await.map_err(Failure::store)?;
        (count, "expired receipts evicted")
    };
    match out.format() {
        Format::Table => out.line(format!("{count} {what}")),
        _ => {
            let doc = json!({ "expired": count, "dry_run": args.dry_run });
            out.json(&doc);
        }
    }
    Ok(Verdict::Done)
}

#[derive(Args)]
pub struct ForgetArgs {
    #[command(flatten)]
    call: CallArgs,
    #[command(flatten)]
    why: WhyArgs,
}

pub async fn forget(rt: &Runtime, args: ForgetArgs, out: &mut Out) -> Result<Verdict, Failure> {
    let key = args.call.key(rt).await?;
    let forgotten = match rt.forget(&key, &args.why.who(), &args.why.reason).await {
        Ok(receipt) => receipt,
        Err(Error::Store(StoreError::NotFound)) => {
            return Err(Failure::unknown(format!(
                "the store holds no receipt for key {} (never made, expired, or forgotten already)",
                key.to_hex()
            )))
        }
        Err(e @ (Error::NotFinished { .. } | Error::OpenCompensation { .. })) => {
            return Err(Failure::usage(e.to_string()))
        }
        Err(Error::Store(e)) => return Err(Failure::store(e)),
        Err(e) => return Err(Failure::usage(e.to_string())),
    };
    match out.format() {
        Format::Table => out.line(format!(
            "forgot call {} ({}): key {} may be claimed again",
            forgotten.call_id,
            forgotten.state,
            key.to_hex()
        )),
        _ => {
            let doc = json!({ "forgotten": out.receipt_json(&forgotten) });
            out.json(&doc);
        }
    }
    Ok(Verdict::Done)
}
