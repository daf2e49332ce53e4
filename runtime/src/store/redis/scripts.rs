//! The server-side scripts, each a `.lua` file in `scripts/` (pulled in here with `include_str!`),
//! and how their answers are read.
//!
//! Each script reads and writes only its `KEYS[1]` (one slot of a cluster), and those that judge time
//! read it from the server first (`now.lua`).

use redis::Script;

use super::{corrupt, RedisStore};
use crate::error::StoreError;
use crate::receipt::Fence;

const CLAIM: &str = concat!(
    include_str!("scripts/now.lua"),
    include_str!("scripts/claim.lua")
);

const TAKE_OVER: &str = concat!(
    include_str!("scripts/now.lua"),
    include_str!("scripts/take_over.lua")
);

const WRITE: &str = include_str!("scripts/write.lua");

const READ: &str = concat!(
    include_str!("scripts/now.lua"),
    include_str!("scripts/read.lua")
);

const PURGE_ONE: &str = concat!(
    include_str!("scripts/now.lua"),
    include_str!("scripts/purge_one.lua")
);

const TAKE_DUE: &str = concat!(
    include_str!("scripts/now.lua"),
    include_str!("scripts/take_due.lua")
);

const JOURNAL: &str = include_str!("scripts/journal.lua");

const ENQUEUE: &str = concat!(
    include_str!("scripts/now.lua"),
    include_str!("scripts/enqueue.lua")
);

const UPDATE_ENTRY: &str = concat!(
    include_str!("scripts/now.lua"),
    include_str!("scripts/update_entry.lua")
);

/// The scripts a store runs: each is sent by its SHA (`EVALSHA`), and loaded on a server that lacks
/// it.
#[derive(Clone)]
pub(super) struct Scripts {
    pub(super) claim: Script,
    pub(super) take_over: Script,
    pub(super) write: Script,
    pub(super) read: Script,
    pub(super) purge_one: Script,
    pub(super) take_due: Script,
    pub(super) enqueue: Script,
    pub(super) update_entry: Script,
    pub(super) journal: Script,
}

impl Scripts {
    pub(super) fn new() -> Scripts {
        Scripts {
            claim: Script::new(CLAIM),
            take_over: Script::new(TAKE_OVER),
            write: Script::new(WRITE),
            read: Script::new(READ),
            purge_one: Script::new(PURGE_ONE),
            take_due: Script::new(TAKE_DUE),
            enqueue: Script::new(ENQUEUE),
            update_entry: Script::new(UPDATE_ENTRY),
            journal: Script::new(JOURNAL),
        }
    }
}

impl RedisStore {
    /// The script a claim runs (in the same round trip as the callId index entry).
    pub const CLAIM_SCRIPT: &'static str = CLAIM;

    /// The script every fenced write (completion, lease, unknown, release) runs.
    pub const WRITE_SCRIPT: &'static str = WRITE;
}

pub(super) fn answer_items(answer: &redis::Value) -> Result<&[redis::Value], StoreError> {
    match answer {
        redis::Value::Array(items) => Ok(items),
        other => Err(corrupt(format!("unexpected script answer {other:?}"))),
    }
}

/// The code a script answered with; `-2` (the script found a stored value it cannot read) is
/// [`StoreError::Corrupt`].
pub(super) fn answer_code(answer: &redis::Value) -> Result<i64, StoreError> {
    let items = answer_items(answer)?;
    match items.first() {
        Some(redis::Value::Int(-2)) => Err(corrupt(match items.get(1) {
            Some(redis::Value::BulkString(why)) => String::from_utf8_lossy(why).into_owned(),
            _ => "unreadable record".to_owned(),
        })),
        Some(redis::Value::Int(code)) => Ok(*code),
        other => Err(corrupt(format!("unexpected script answer {other:?}"))),
    }
}

pub(super) fn answer_fields(answer: &redis::Value) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let items = answer_items(answer)?;
    let Some(redis::Value::Array(flat)) = items.get(1) else {
        return Ok(Vec::new());
    };
    let mut fields = Vec::with_capacity(flat.len() / 2);
    for pair in flat.chunks(2) {
        match pair {
            [redis::Value::BulkString(name), redis::Value::BulkString(value)] => fields.push((
                String::from_utf8(name.clone()).map_err(corrupt)?,
                value.clone(),
            )),
            other => return Err(corrupt(format!("unexpected record field {other:?}"))),
        }
    }
    Ok(fields)
}

/// The decimal number a script answered at `index`.
pub(super) fn answer_number(
    answer: &redis::Value,
    index: usize,
    what: &str,
) -> Result<u64, StoreError> {
    match answer_items(answer)?.get(index) {
        Some(redis::Value::BulkString(text)) => number(text, what),
        other => Err(corrupt(format!("unexpected {what} {other:?}"))),
    }
}

pub(super) fn answer_fence(answer: &redis::Value) -> Result<Fence, StoreError> {
    match answer_items(answer)?.get(1) {
        Some(redis::Value::BulkString(text)) => std::str::from_utf8(text)
            .ok()
            .and_then(|t| t.parse().ok())
            .map(Fence)
            .ok_or_else(|| corrupt("a fence is a decimal number")),
        other => Err(corrupt(format!("unexpected fence {other:?}"))),
    }
}

pub(super) fn text(value: &[u8], what: &str) -> Result<String, StoreError> {
    String::from_utf8(value.to_vec()).map_err(|_| corrupt(format!("{what} is not UTF-8")))
}

pub(super) fn number(value: &[u8], what: &str) -> Result<u64, StoreError> {
    text(value, what)?
        .parse()
        .map_err(|_| corrupt(format!("{what} is not a number")))
}

pub(super) fn optional_number(
    value: Option<&Vec<u8>>,
    what: &str,
) -> Result<Option<u64>, StoreError> {
    match value {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => number(v, what).map(Some),
    }
}
