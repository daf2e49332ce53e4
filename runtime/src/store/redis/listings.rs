//! Listings, counts and purges on Redis. A page of receipts is read from the creation-time index (16
//! sorted sets), so its cost does not grow with the receipts held; the rest scans every record
//! (`SCAN` on every primary), at the pace of the compensation worker, not per call.

use futures_util::StreamExt;
use redis::AsyncCommands;

use super::connection::Connection;
use super::{unavailable, RedisStore, TIME_SHARDS};
use crate::error::StoreError;
use crate::key::{digest_from_hex, Key};
use crate::receipt::{Receipt, ReceiptState};
use crate::store::{Cursor, ReceiptPage, ReceiptQuery, Store};

impl RedisStore {
    /// [`Store::purge_expired`]: the `PURGE_ONE` script on every record, then the creation-time
    /// index pruned.
    pub(super) async fn purge_expired_records(&self) -> Result<usize, StoreError> {
        let names = self.record_names().await?;
        let mut purged = 0;
        for name in names {
            let gone: i64 = self
                .scripts
                .purge_one
                .key(name)
                .invoke_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            purged += usize::from(gone == 1);
        }
        self.prune_time_index().await?;
        Ok(purged)
    }

    /// [`Store::count_expired`] (see the method's documentation on [`RedisStore`]).
    pub(super) async fn count_expired_records(&self, now_ms: u64) -> Result<usize, StoreError> {
        let now = self.now_ms(now_ms).await?;
        let mut expired = 0;
        for batch in self.record_names().await?.chunks(500) {
            let mut pipe = redis::pipe();
            for name in batch {
                pipe.hget(name, "expires_at");
            }
            let expiries: Vec<Option<u64>> = match self.conn() {
                Connection::Cluster(mut c) => {
                    // A cluster pipeline's commands go to their keys' nodes one by one.
                    let mut all = Vec::with_capacity(batch.len());
                    for name in batch {
                        all.push(c.hget(name, "expires_at").await.map_err(unavailable)?);
                    }
                    all
                }
                mut conn => pipe.query_async(&mut conn).await.map_err(unavailable)?,
            };
            expired += expiries
                .into_iter()
                .filter(|at| at.is_some_and(|at| at <= now))
                .count();
        }
        Ok(expired)
    }

    /// [`Store::list_receipts`] (see the method's documentation on [`RedisStore`]).
    pub(super) async fn receipt_page(
        &self,
        query: &ReceiptQuery,
    ) -> Result<ReceiptPage, StoreError> {
        let limit = query.limit.max(1);
        let from_ms = query
            .after
            .map_or(query.since_ms, |c| c.created_ms.max(query.since_ms));
        // This process's claims whose index entries are still on their way, read before the index:
        // an entry that leaves this set was written to the index first, so the reads below see it
        // (read after them, an entry written meanwhile would be in neither).
        let mut candidates: Vec<Cursor> = self
            .unindexed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(digest, entry)| Cursor {
                created_ms: entry.created_ms,
                digest: *digest,
            })
            .filter(|c| {
                (from_ms..query.until_ms).contains(&c.created_ms)
                    && query.after.is_none_or(|after| *c > after)
            })
            .collect();
        if from_ms < query.until_ms {
            // A shard holds about a sixteenth of a page: each is asked for twice that first, and
            // only a shard that had more and whose last asked-for key falls inside the page is asked
            // for a whole page.
            let first_want = (limit / usize::from(TIME_SHARDS) * 2 + 16).min(limit + 1);
            let ask = |shard: u8, want: usize| {
                self.indexed_after(shard, from_ms, query.until_ms, query.after, want)
            };
            let mut shards: Vec<Vec<Cursor>> =
                futures_util::future::try_join_all((0..TIME_SHARDS).map(|s| ask(s, first_want)))
                    .await?;
            let cut = shards
                .iter()
                .filter(|got| got.len() == first_want)
                .filter_map(|got| got.last().copied())
                .min();
            if let Some(cut) = cut {
                let settled = shards.iter().flatten().filter(|c| **c <= cut).count();
                if settled <= limit {
                    for (shard, got) in (0..TIME_SHARDS).zip(shards.iter_mut()) {
                        if got.len() == first_want {
                            *got = ask(shard, limit + 1).await?;
                        }
                    }
                }
            }
            candidates.extend(shards.into_iter().flatten());
        }
        candidates.sort_unstable();
        candidates.dedup();
        let next = (candidates.len() > limit).then(|| candidates[limit - 1]);
        candidates.truncate(limit);
        // Plain reads (side by side on the connection), judged by one reading of the server's clock.
        let now = self.now_ms(0).await?;
        let read: Vec<Result<(Cursor, Option<Receipt>), StoreError>> =
            futures_util::stream::iter(candidates)
                .map(|c| async move {
                    let record = self.record(&Key::from_digest("", c.digest)).await?;
                    Ok((c, record))
                })
                .buffered(64)
                .collect()
                .await;
        let mut receipts = Vec::with_capacity(read.len());
        for row in read {
            let (at, record) = row?;
            // Gone (expired, given back), or claimed again since (listed at its new time).
            if let Some(r) = record.filter(|r| {
                !r.expired(now)
                    && Cursor::of(r) == at
                    && (query.since_ms..query.until_ms).contains(&r.created_ms)
                    && query.after.is_none_or(|after| Cursor::of(r) > after)
                    && query.admits(r)
            }) {
                receipts.push(r);
            }
        }
        receipts.sort_unstable_by_key(Cursor::of);
        Ok(ReceiptPage { receipts, next })
    }

    /// [`Store::list_orphans`] (see the method's documentation on [`RedisStore`]).
    pub(super) async fn orphan_records(&self, limit: usize) -> Result<Vec<Receipt>, StoreError> {
        let candidates = self
            .records_where(|r, now| r.state == ReceiptState::Processing && !r.lease_alive(now))
            .await?;
        let mut orphans = Vec::new();
        for r in candidates {
            let queued: bool = self
                .conn()
                .hexists(self.queue_key(), r.call_id.to_string())
                .await
                .map_err(unavailable)?;
            if !queued {
                orphans.push(r);
            }
        }
        orphans.sort_by_key(|r| r.lease_until_ms);
        orphans.truncate(limit);
        Ok(orphans)
    }

    /// Every record `keep` admits, judged at the server's time it was read at.
    async fn records_where(
        &self,
        keep: impl Fn(&Receipt, u64) -> bool,
    ) -> Result<Vec<Receipt>, StoreError> {
        let prefix = format!("{}:r:{{", self.prefix);
        let mut kept = Vec::new();
        for name in self.record_names().await? {
            let Some(digest) = name
                .strip_prefix(&prefix)
                .and_then(|rest| rest.strip_suffix('}'))
                .and_then(digest_from_hex)
            else {
                continue;
            };
            let (now, record) = self.read_at(&Key::from_digest("", digest), "").await?;
            if let Some(r) = record.filter(|r| keep(r, now)) {
                kept.push(r);
            }
        }
        Ok(kept)
    }

    /// The names of every record key, from every primary (`SCAN`, in batches).
    async fn record_names(&self) -> Result<Vec<String>, StoreError> {
        self.names(&format!("{}:r:*", self.prefix)).await
    }

    /// Up to `want` positions of one shard of the creation-time index in `[from_ms, until_ms)` that
    /// come after `after`, in order.
    async fn indexed_after(
        &self,
        shard: u8,
        from_ms: u64,
        until_ms: u64,
        after: Option<Cursor>,
        want: usize,
    ) -> Result<Vec<Cursor>, StoreError> {
        let mut found = Vec::new();
        let mut offset = 0usize;
        loop {
            let batch: Vec<(String, f64)> = redis::cmd("ZRANGE")
                .arg(self.time_key(shard))
                .arg(from_ms)
                .arg(format!("({until_ms}"))
                .arg("BYSCORE")
                .arg("LIMIT")
                .arg(offset)
                .arg(want)
                .arg("WITHSCORES")
                .query_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            let full = batch.len() == want;
            offset += batch.len();
            for (member, score) in batch {
                let Some(digest) = digest_from_hex(&member) else {
                    continue;
                };
                // Creation times are whole milliseconds, exact in a score (a double).
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let at = Cursor {
                    created_ms: score as u64,
                    digest,
                };
                if after.is_none_or(|after| at > after) {
                    found.push(at);
                }
            }
            // Only keys at the cursor's own millisecond are skipped: another batch is rare.
            if found.len() >= want || !full {
                found.truncate(want);
                return Ok(found);
            }
        }
    }

    /// Removes from the creation-time index the keys whose record is gone (Redis expired it).
    async fn prune_time_index(&self) -> Result<(), StoreError> {
        const BATCH: usize = 1_000;
        for shard in 0..TIME_SHARDS {
            let set = self.time_key(shard);
            let mut start = 0usize;
            loop {
                let members: Vec<String> = redis::cmd("ZRANGE")
                    .arg(&set)
                    .arg(start)
                    .arg(start + BATCH - 1)
                    .query_async(&mut self.conn())
                    .await
                    .map_err(unavailable)?;
                let records: Vec<String> = members
                    .iter()
                    .map(|member| format!("{}:r:{{{member}}}", self.prefix))
                    .collect();
                let exists: Vec<Result<bool, StoreError>> = futures_util::stream::iter(records)
                    .map(|record| {
                        let mut conn = self.conn();
                        async move {
                            redis::cmd("EXISTS")
                                .arg(record)
                                .query_async::<bool>(&mut conn)
                                .await
                                .map_err(unavailable)
                        }
                    })
                    .buffered(64)
                    .collect()
                    .await;
                let mut gone = Vec::new();
                for (member, exists) in members.iter().zip(exists) {
                    if !exists? {
                        gone.push(member.as_str());
                    }
                }
                if !gone.is_empty() {
                    let _: usize = redis::cmd("ZREM")
                        .arg(&set)
                        .arg(&gone)
                        .query_async(&mut self.conn())
                        .await
                        .map_err(unavailable)?;
                }
                if members.len() < BATCH {
                    break;
                }
                start += BATCH - gone.len();
            }
        }
        Ok(())
    }
}
