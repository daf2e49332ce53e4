//! The journals on Redis: a key's journal is the list `samekey:j:{<digest>}`, in the slot of its record,
//! appended by a server-side script (`JOURNAL`) that reads the record to keep the list as long as it
//! lives, and keeps its latest [`JOURNAL_LIMIT`] events.

use redis::AsyncCommands;

use super::{unavailable, RedisStore};
use crate::call_id::CallId;
use crate::error::StoreError;
use crate::journal::{self, Event, JOURNAL_LIMIT};
use crate::key::{digest_from_hex, Key};
use crate::store::Store;

impl RedisStore {
    /// [`Store::append_journal`]: the `JOURNAL` script, on the key's list.
    pub(super) async fn append_events(
        &self,
        key: &Key,
        events: &[Event],
        keep_ms: u64,
    ) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let mut invocation = self.scripts.journal.key(self.record_key(key));
        invocation
            .key(self.journal_key(key))
            .arg(keep_ms)
            .arg(JOURNAL_LIMIT);
        for event in &events[events.len().saturating_sub(JOURNAL_LIMIT)..] {
            invocation.arg(journal::encode(event)?);
        }
        invocation
            .invoke_async::<()>(&mut self.conn())
            .await
            .map_err(unavailable)
    }

    /// [`Store::journal`].
    pub(super) async fn events_of_key(&self, key: &Key) -> Result<Vec<Event>, StoreError> {
        let all: Vec<Vec<u8>> = self
            .conn()
            .lrange(self.journal_key(key), 0, -1)
            .await
            .map_err(unavailable)?;
        all.iter().map(|text| journal::decode(text)).collect()
    }

    /// [`Store::journaled_keys`] (see the method's documentation on [`RedisStore`]).
    pub(super) async fn journaled_keys_page(
        &self,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError> {
        let prefix = format!("{}:j:{{", self.prefix);
        let names = self.names(&format!("{prefix}*")).await?;
        let digests = names
            .iter()
            .filter_map(|name| digest_from_hex(name.strip_prefix(&prefix)?.strip_suffix('}')?));
        Ok(crate::store::page_of_keys(digests, after, limit))
    }

    /// [`Store::journal_of_call`]: the key from the callId index, then its journal.
    pub(super) async fn events_of_call(
        &self,
        call_id: &CallId,
        now_ms: u64,
    ) -> Result<Vec<Event>, StoreError> {
        let Some(key) = self.key_of_call(call_id).await? else {
            return Ok(Vec::new());
        };
        let mut events = self.journal(&key, now_ms).await?;
        events.retain(|e| &e.call_id == call_id);
        Ok(events)
    }
}
