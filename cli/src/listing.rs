//! `samekey ls` and `samekey stats`: receipts by creation time, page by page, and their counts.

use std::collections::BTreeMap;

use clap::Args;
use samekey_runtime::store::Cursor;
use samekey_runtime::Runtime;

use crate::args::{cursor_arg, now_ms, RangeArgs};
use crate::output::{Out, Progress};
use crate::{Failure, Verdict};

#[derive(Args)]
pub struct LsArgs {
    #[command(flatten)]
    range: RangeArgs,
    /// At most this many receipts.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// Continue after this position (printed as `next:` at the end of a page).
    #[arg(long)]
    after: Option<String>,
}

pub async fn ls(rt: &Runtime, args: LsArgs, out: &mut Out) -> Result<Verdict, Failure> {
    let limit = args.limit.clamp(1, 100_000);
    let mut query = args.range.query()?.limit(limit.min(1_000));
    if let Some(after) = &args.after {
        query = query.after(cursor_arg(after)?);
    }
    let mut listed = Vec::new();
    let mut next = None;
    let mut progress = Progress::new("receipts read");
    // Filters may leave a page short: read on until the limit is reached or the range ends.
    loop {
        let page = rt
            .store()
            .list_receipts(&query, now_ms())
            .await
            .map_err(Failure::store)?;
        listed.extend(page.receipts.into_iter().filter(|r| args.range.admits(r)));
        progress.tick(listed.len() as u64);
        match page.next {
            Some(at) if listed.len() < limit => query = query.after(at),
            Some(at) => {
                next = Some(at);
                break;
            }
            None => break,
        }
    }
    drop(progress);
    if listed.len() > limit {
        next = listed.get(limit - 1).map(Cursor::of);
        listed.truncate(limit);
    }
    out.receipts(&listed, next);
    Ok(Verdict::Done)
}

pub async fn stats(rt: &Runtime, range: RangeArgs, out: &mut Out) -> Result<Verdict, Failure> {
    let mut query = range.query()?;
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    let (mut read, mut progress) = (0u64, Progress::new("receipts counted"));
    loop {
        let page = rt
            .store()
            .list_receipts(&query, now_ms())
            .await
            .map_err(Failure::store)?;
        read += page.receipts.len() as u64;
        progress.tick(read);
        for r in page.receipts.iter().filter(|r| range.admits(r)) {
            *counts
                .entry((r.key.scope().to_owned(), r.state.to_string()))
                .or_default() += 1;
        }
        match page.next {
            Some(at) => query = query.after(at),
            None => break,
        }
    }
    drop(progress);
    out.stats(&counts);
    Ok(Verdict::Done)
}
