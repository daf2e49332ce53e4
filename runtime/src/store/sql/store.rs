//! [`Store`] for [`SqlStore`], written once for every [`Dialect`]: each method binds the parameters of
//! one of the dialect's [`Statements`](super::Statements), and reads the row again where a
//! conditional write changed nothing, to say why.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use super::rows::fence_of;
use super::rows::{bound, compensation, driver, int, outcome_name, receipt};
use super::{Dialect, SqlStore};
use crate::call_id::CallId;
use crate::compensation::CompensationEntry;
use crate::error::StoreError;
use crate::journal::{self, Event};
use crate::key::Key;
use crate::receipt::{Fence, Receipt, ReceiptState, Transition};
use crate::store::{
    already_or_not_owned, not_owned, Claim, Claimed, Completion, Cursor, OpenError, ReceiptPage,
    ReceiptQuery, Store, StoreClock,
};

/// The helpers of the [`Store`] methods below (the same bounds: what the statements bind and read).
impl<D: Dialect> SqlStore<D>
where
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    D::Arguments: IntoArguments<D>,
    for<'q> i64: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> String: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> Vec<u8>: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> &'q [u8]: Encode<'q, D> + Type<D>,
    for<'q> Option<i64>: Encode<'q, D>,
    for<'q> Option<String>: Encode<'q, D>,
    for<'q> Option<&'q [u8]>: Encode<'q, D>,
    for<'a> &'a str: ColumnIndex<D::Row>,
    usize: ColumnIndex<D::Row>,
{
    /// Refuses a database that holds none of samekey's tables ([`Statements::holds_tables`]):
    /// opening an existing store never creates one. `url` names it in the error.
    ///
    /// [`Statements::holds_tables`]: super::Statements::holds_tables
    pub(crate) async fn refuse_unmigrated(&self, url: &str) -> Result<(), OpenError> {
        let tables: i64 = sqlx::query_scalar(D::SQL.holds_tables)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| OpenError::unreachable(url, e))?;
        if tables == 0 {
            return Err(OpenError::never_migrated(url));
        }
        Ok(())
    }

    /// The journal events `statement` reads (`$1` `value`, `$2` now).
    async fn journal_rows(
        &self,
        statement: &'static str,
        value: impl for<'q> Encode<'q, D> + Type<D> + Send,
        now_ms: u64,
    ) -> Result<Vec<Event>, StoreError> {
        let rows: Vec<String> = sqlx::query_scalar(statement)
            .bind(value)
            .bind(int(now_ms)?)
            .fetch_all(&self.pool)
            .await
            .map_err(driver)?;
        rows.iter()
            .map(|text| journal::decode(text.as_bytes()))
            .collect()
    }

    /// Why a fenced update of the entry `call_id` changed nothing: it is gone (`NotFound`), or
    /// another worker took it (`Fenced`).
    async fn entry_refusal(&self, call_id: &CallId, fence: Fence) -> StoreError {
        let taker: Result<Option<i64>, _> = sqlx::query_scalar(D::SQL.taker)
            .bind(call_id.to_string())
            .fetch_optional(&self.pool)
            .await;
        match taker {
            Err(e) => driver(e),
            Ok(None) => StoreError::NotFound,
            Ok(Some(current)) => StoreError::Fenced {
                presented: fence.0,
                current: u64::try_from(current).unwrap_or(0),
            },
        }
    }

    /// The key's row on `conn` by `statement` (`key_row` or `refused_row`), whatever its expiry (`None`
    /// for no row or a released one).
    async fn row_on(
        conn: &mut D::Connection,
        statement: &'static str,
        key: &Key,
    ) -> Result<Option<Receipt>, StoreError> {
        let row = sqlx::query(statement)
            .bind(key.digest().as_slice())
            .fetch_optional(&mut *conn)
            .await
            .map_err(driver)?;
        match row {
            Some(row) => receipt(&row),
            None => Ok(None),
        }
    }

    /// Runs `statement`, an update of the key's row (`$1`) held under `fence` (`$2`); answers
    /// whether it changed it.
    async fn fenced(
        &self,
        statement: &'static str,
        key: &Key,
        fence: Fence,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(statement)
            .bind(key.digest().as_slice())
            .bind(int(fence.0)?)
            .execute(&self.pool)
            .await
            .map_err(driver)?;
        Ok(D::rows_affected(&done) == 1)
    }

    /// The key's row, whatever its expiry.
    pub(crate) async fn row(&self, key: &Key) -> Result<Option<Receipt>, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(driver)?;
        Self::row_on(&mut conn, D::SQL.key_row, key).await
    }

    /// [`Store::take_over`] (or [`Store::reopen`]: `sql` says which) by one statement that answers
    /// the new fence (`RETURNING`): `$1` lease, `$2` now, `$3` key, `$4` expected fence.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) async fn take_over_returning(
        &self,
        sql: &'static str,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Claimed, StoreError> {
        // `fetch_all`: on SQLite a statement commits when it runs to its end, and only then is a
        // failed commit reported.
        let taken: Vec<i64> = sqlx::query_scalar(sql)
            .bind(int(lease_ms)?)
            .bind(int(now_ms)?)
            .bind(key.digest().as_slice())
            .bind(int(expected.0)?)
            .fetch_all(&self.pool)
            .await
            .map_err(driver)?;
        match taken.first() {
            Some(&fence) => Ok(Claimed::Acquired(fence_of(fence)?)),
            None => match self.row(key).await? {
                Some(record) => Ok(Claimed::Existing(record)),
                None => Err(StoreError::NotFound),
            },
        }
    }

    /// [`Store::take_due_compensations`] by one statement that answers the entries it took
    /// (`RETURNING`): `$1` lease, `$2` now, `$3` limit.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) async fn take_due_returning(
        &self,
        now_ms: u64,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<CompensationEntry>, StoreError> {
        let rows = sqlx::query(D::SQL.take_due)
            .bind(int(lease_ms)?)
            .bind(int(now_ms)?)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(driver)?;
        let taken = rows
            .iter()
            .map(compensation)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(taken)
    }

    /// Records the running `call`'s success with `value` on `conn`, the caller's transaction: what
    /// `PgStore::complete_in` and `SqliteStore::complete_in` do. Nothing is written for an unprotected
    /// call ([`Transition::AlreadyApplied`]).
    pub(crate) async fn complete_call_on<T: serde::Serialize>(
        conn: &mut D::Connection,
        call: &crate::context::Context,
        value: &T,
    ) -> Result<Transition, StoreError> {
        if !call.is_protected() {
            return Ok(Transition::AlreadyApplied);
        }
        let outcome = crate::codec::stored_json(value)
            .map_err(|e| StoreError::Corrupt(format!("the outcome cannot be encoded: {e}")))?;
        // The receipt's ttl counts from this write, not from the attempt's start: a job longer than
        // its ttl still writes a live receipt.
        let now = call.now_ms();
        let completion = Completion {
            state: crate::receipt::ReceiptState::Success,
            outcome: Some(outcome.into()),
            ttl_ms: call.ttl_ms(),
        };
        Self::complete_on(conn, call.key(), call.fence(), completion, now).await
    }

    /// Writes a completion on `conn`: a pooled connection, or the caller's transaction.
    pub(crate) async fn complete_on(
        conn: &mut D::Connection,
        key: &Key,
        fence: Fence,
        completion: Completion,
        now_ms: u64,
    ) -> Result<Transition, StoreError> {
        let done = sqlx::query(D::SQL.complete)
            .bind(completion.state.as_str())
            .bind(completion.outcome.as_deref())
            .bind(int(completion.ttl_ms)?)
            .bind(int(now_ms)?)
            .bind(key.digest().as_slice())
            .bind(int(fence.0)?)
            .execute(&mut *conn)
            .await
            .map_err(driver)?;
        if D::rows_affected(&done) == 1 {
            return Ok(Transition::Applied);
        }
        let current = Self::row_on(conn, D::SQL.refused_row, key).await?;
        already_or_not_owned(current.as_ref(), fence, completion.state)
    }

    /// The receipts of `rows` (released tombstones left out).
    fn receipts(rows: &[D::Row]) -> Result<Vec<Receipt>, StoreError> {
        rows.iter()
            .filter_map(|row| receipt(row).transpose())
            .collect()
    }
}

#[async_trait]
impl<D: Dialect> Store for SqlStore<D>
where
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    D::Arguments: IntoArguments<D>,
    for<'q> i64: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> String: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> Vec<u8>: Encode<'q, D> + Decode<'q, D> + Type<D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> &'q [u8]: Encode<'q, D> + Type<D>,
    for<'q> Option<i64>: Encode<'q, D>,
    for<'q> Option<String>: Encode<'q, D>,
    for<'q> Option<&'q [u8]>: Encode<'q, D>,
    for<'a> &'a str: ColumnIndex<D::Row>,
    usize: ColumnIndex<D::Row>,
{
    async fn claim(&self, claim: Claim) -> Result<Claimed, StoreError> {
        D::claim(self, claim).await
    }

    async fn take_over(
        &self,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Claimed, StoreError> {
        D::take_over(self, D::SQL.take_over, key, expected, lease_ms, now_ms).await
    }

    async fn reopen(
        &self,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Claimed, StoreError> {
        D::take_over(self, D::SQL.reopen, key, expected, lease_ms, now_ms).await
    }

    async fn extend_lease(
        &self,
        key: &Key,
        fence: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let done = sqlx::query(D::SQL.extend_lease)
            .bind(int(lease_ms)?)
            .bind(key.digest().as_slice())
            .bind(int(fence.0)?)
            .bind(int(now_ms)?)
            .execute(&self.pool)
            .await
            .map_err(driver)?;
        if D::rows_affected(&done) == 1 {
            return Ok(());
        }
        let current = self.row(key).await?;
        Err(not_owned(current.as_ref(), fence, ReceiptState::Processing))
    }

    async fn complete(
        &self,
        key: &Key,
        fence: Fence,
        completion: Completion,
        now_ms: u64,
    ) -> Result<Transition, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(driver)?;
        Self::complete_on(&mut conn, key, fence, completion, now_ms).await
    }

    async fn mark_unknown(
        &self,
        key: &Key,
        fence: Fence,
        now_ms: u64,
    ) -> Result<Transition, StoreError> {
        let done = sqlx::query(D::SQL.mark_unknown)
            .bind(int(now_ms)?)
            .bind(key.digest().as_slice())
            .bind(int(fence.0)?)
            .execute(&self.pool)
            .await
            .map_err(driver)?;
        if D::rows_affected(&done) == 1 {
            return Ok(Transition::Applied);
        }
        let current = self.row(key).await?;
        already_or_not_owned(current.as_ref(), fence, ReceiptState::Unknown)
    }

    async fn release(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        if self.fenced(D::SQL.release, key, fence).await? {
            return Ok(());
        }
        match self.row(key).await? {
            None => Ok(()),
            Some(current) => Err(not_owned(Some(&current), fence, ReceiptState::Received)),
        }
    }

    async fn forget(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        if self.fenced(D::SQL.forget, key, fence).await? {
            return Ok(());
        }
        Err(not_owned(
            self.row(key).await?.as_ref(),
            fence,
            ReceiptState::Received,
        ))
    }

    async fn get(&self, key: &Key, now_ms: u64) -> Result<Option<Receipt>, StoreError> {
        let row = sqlx::query(D::SQL.live_row)
            .bind(key.digest().as_slice())
            .bind(int(now_ms)?)
            .fetch_optional(&self.pool)
            .await
            .map_err(driver)?;
        match row {
            Some(row) => receipt(&row),
            None => Ok(None),
        }
    }

    async fn get_by_call_id(&self, call_id: &CallId) -> Result<Option<Receipt>, StoreError> {
        let row = sqlx::query(D::SQL.by_call_id)
            .bind(call_id.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(driver)?;
        match row {
            Some(row) => receipt(&row),
            None => Ok(None),
        }
    }

    async fn get_by_call_ids(&self, call_ids: &[CallId]) -> Result<Vec<Receipt>, StoreError> {
        if call_ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = call_ids.iter().map(|c| c.as_str()).collect();
        let list = serde_json::to_string(&ids).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let rows = sqlx::query(D::SQL.by_call_ids)
            .bind(list)
            .fetch_all(&self.pool)
            .await
            .map_err(driver)?;
        Self::receipts(&rows)
    }

    async fn wait_settled(
        &self,
        key: &Key,
        timeout: Duration,
        now_ms: u64,
    ) -> Result<Option<Receipt>, StoreError> {
        D::wait_settled(self, key, timeout, now_ms).await
    }

    fn kind(&self) -> &'static str {
        D::KIND
    }

    fn clock(&self) -> StoreClock {
        match D::SQL.now {
            Some(_) => StoreClock::Own,
            None => StoreClock::Caller,
        }
    }

    async fn now_ms(&self, caller_now_ms: u64) -> Result<u64, StoreError> {
        let Some(statement) = D::SQL.now else {
            return Ok(caller_now_ms);
        };
        let now: i64 = sqlx::query_scalar(statement)
            .bind(int(caller_now_ms)?)
            .fetch_one(&self.pool)
            .await
            .map_err(driver)?;
        u64::try_from(now).map_err(|_| StoreError::Corrupt(format!("the store's time is {now}")))
    }

    async fn purge_expired(&self, now_ms: u64) -> Result<usize, StoreError> {
        // The purge scans what expired while claims take rows: where the database reports a lock
        // conflict between them (MySQL), the purge gives way and runs again (the floor is raised
        // again first, so it covers every row the delete may take).
        let now = int(now_ms)?;
        let mut conflicts = 0;
        let done = loop {
            let purged = async {
                if let Some(statement) = D::SQL.fence_floor {
                    sqlx::query(statement).bind(now).execute(&self.pool).await?;
                }
                sqlx::query(D::SQL.purge_expired)
                    .bind(now)
                    .execute(&self.pool)
                    .await
            };
            match purged.await {
                Ok(done) => break done,
                Err(e) if D::lock_conflict(&e) && conflicts < 3 => conflicts += 1,
                Err(e) => return Err(driver(e)),
            }
        };
        sqlx::query(D::SQL.purge_journal)
            .bind(now)
            .execute(&self.pool)
            .await
            .map_err(driver)?;
        Ok(usize::try_from(D::rows_affected(&done)).unwrap_or(usize::MAX))
    }

    async fn count_expired(&self, now_ms: u64) -> Result<usize, StoreError> {
        let count: i64 = sqlx::query_scalar(D::SQL.count_expired)
            .bind(int(now_ms)?)
            .fetch_one(&self.pool)
            .await
            .map_err(driver)?;
        Ok(usize::try_from(count).unwrap_or(0))
    }

    async fn list_receipts(
        &self,
        query: &ReceiptQuery,
        now_ms: u64,
    ) -> Result<ReceiptPage, StoreError> {
        let limit = query.limit.max(1);
        // The position to start after, as one row value the index range starts at: the cursor, or
        // just before the range (no 32-byte digest is above all-ones).
        let (after_ms, after_key) = match &query.after {
            Some(c) if c.created_ms >= query.since_ms => (int(c.created_ms)?, c.digest.to_vec()),
            _ => (bound(query.since_ms) - 1, vec![0xff; 32]),
        };
        let statement = match query.scope {
            Some(_) => D::SQL.list_receipts_of_scope,
            None => D::SQL.list_receipts,
        };
        let mut listing = sqlx::query(statement)
            .bind(bound(query.until_ms))
            .bind(int(now_ms)?)
            .bind(after_ms)
            .bind(after_key);
        if let Some(scope) = &query.scope {
            listing = listing.bind(scope.as_str());
        }
        // The limit last: a MySQL statement's `LIMIT ?` is its last placeholder.
        let rows = listing
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(driver)?;
        let mut read = Self::receipts(&rows)?;
        let next = (rows.len() == limit)
            .then(|| read.last().map(Cursor::of))
            .flatten();
        read.retain(|r| query.admits(r));
        Ok(ReceiptPage {
            receipts: read,
            next,
        })
    }

    async fn list_orphans(&self, now_ms: u64, limit: usize) -> Result<Vec<Receipt>, StoreError> {
        let rows = sqlx::query(D::SQL.orphans)
            .bind(int(now_ms)?)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(driver)?;
        Self::receipts(&rows)
    }

    async fn enqueue_compensation(&self, entry: CompensationEntry) -> Result<(), StoreError> {
        sqlx::query(D::SQL.enqueue)
            .bind(entry.call_id.to_string())
            .bind(entry.key.digest().as_slice())
            .bind(entry.key.scope())
            .bind(&entry.reason)
            .bind(i64::from(entry.round))
            // Due this long after the store's now (the server's clock, where there is one).
            .bind(int(entry.next_at_ms.saturating_sub(entry.enqueued_ms))?)
            .bind(int(entry.enqueued_ms)?)
            .bind(i64::from(entry.attempts))
            .bind(entry.last_error.map(outcome_name))
            .bind(entry.encoded_inputs.as_deref())
            .execute(&self.pool)
            .await
            .map_err(driver)?;
        Ok(())
    }

    async fn take_due_compensations(
        &self,
        now_ms: u64,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<CompensationEntry>, StoreError> {
        let mut taken = D::take_due(self, now_ms, limit, lease_ms).await?;
        taken.sort_by_key(|e| (e.next_at_ms, e.enqueued_ms));
        Ok(taken)
    }

    async fn reschedule_compensation(
        &self,
        call_id: &CallId,
        fence: Fence,
        round: u32,
        delay_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let done = sqlx::query(D::SQL.reschedule)
            .bind(i64::from(round))
            .bind(int(now_ms)?)
            .bind(int(delay_ms)?)
            .bind(call_id.to_string())
            .bind(int(fence.0)?)
            .execute(&self.pool)
            .await
            .map_err(driver)?;
        if D::rows_affected(&done) == 0 {
            return Err(self.entry_refusal(call_id, fence).await);
        }
        Ok(())
    }

    async fn finish_compensation(
        &self,
        call_id: &CallId,
        fence: Option<Fence>,
    ) -> Result<(), StoreError> {
        let done = sqlx::query(D::SQL.finish)
            .bind(call_id.to_string())
            .bind(fence.map(|f| int(f.0)).transpose()?)
            .execute(&self.pool)
            .await
            .map_err(driver)?;
        match fence {
            Some(fence) if D::rows_affected(&done) == 0 => {
                match self.entry_refusal(call_id, fence).await {
                    // Gone already: finishing it again changes nothing.
                    StoreError::NotFound => Ok(()),
                    refused => Err(refused),
                }
            }
            _ => Ok(()),
        }
    }

    async fn escalate_compensation(
        &self,
        call_id: &CallId,
        fence: Fence,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let done = sqlx::query(D::SQL.escalate)
            .bind(int(now_ms)?)
            .bind(call_id.to_string())
            .bind(int(fence.0)?)
            .execute(&self.pool)
            .await
            .map_err(driver)?;
        if D::rows_affected(&done) == 0 {
            return Err(self.entry_refusal(call_id, fence).await);
        }
        Ok(())
    }

    async fn list_compensations(&self) -> Result<Vec<CompensationEntry>, StoreError> {
        let rows = sqlx::query(D::SQL.list_compensations)
            .fetch_all(&self.pool)
            .await
            .map_err(driver)?;
        rows.iter().map(compensation).collect()
    }

    async fn append_journal(
        &self,
        key: &Key,
        events: &[Event],
        keep_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        D::append_journal(self, key, events, keep_ms, now_ms).await
    }

    async fn journal(&self, key: &Key, now_ms: u64) -> Result<Vec<Event>, StoreError> {
        self.journal_rows(D::SQL.journal_by_key, key.digest().to_vec(), now_ms)
            .await
    }

    async fn journaled_keys(
        &self,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError> {
        let after = after.map_or_else(Vec::new, |d| d.to_vec());
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows: Vec<Vec<u8>> = sqlx::query_scalar(D::SQL.journaled_keys)
            .bind(after)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(driver)?;
        rows.into_iter()
            .map(|digest| {
                let digest: [u8; 32] = digest.as_slice().try_into().map_err(|_| {
                    StoreError::Corrupt(format!("a journal key of {} bytes, not 32", digest.len()))
                })?;
                Ok(Key::from_digest("", digest))
            })
            .collect()
    }

    async fn journal_of_call(
        &self,
        call_id: &CallId,
        now_ms: u64,
    ) -> Result<Vec<Event>, StoreError> {
        self.journal_rows(D::SQL.journal_by_call, call_id.to_string(), now_ms)
            .await
    }
}
