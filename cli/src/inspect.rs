//! `samekey inspect`: a call's (or a key's) receipt and timeline.

use samekey_runtime::{journal::CallHistory, Key, Runtime};

use crate::args::{CallArgs, Target};
use crate::output::Out;
use crate::{Failure, Verdict};

pub async fn inspect(rt: &Runtime, args: CallArgs, out: &mut Out) -> Result<Verdict, Failure> {
    let history = match args.target()? {
        Target::Call(call_id) => {
            let history = rt.history(&call_id).await.map_err(Failure::store)?;
            if is_empty(&history) {
                return Err(Failure::unknown(format!(
                    "the store knows no call {call_id} (never made here, given back and forgotten, or expired)"
                )));
            }
            history
        }
        Target::Key(key) => known(rt.history_of_key(&key).await.map_err(Failure::store)?, &key)?,
    };
    out.history(&history);
    Ok(Verdict::Done)
}

fn is_empty(history: &CallHistory) -> bool {
    history.receipt.is_none() && history.events.is_empty()
}

fn known(history: CallHistory, key: &Key) -> Result<CallHistory, Failure> {
    if is_empty(&history) {
        return Err(Failure::unknown(format!(
            "the store holds nothing for key {}",
            key.to_hex()
        )));
    }
    Ok(history)
}
