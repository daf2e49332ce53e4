//! The transactional outbox (`docs/rules.md`, *Field lessons*): a message staged in the caller's own database
//! transaction, beside the business rows and the receipt, so that the three commit or none does; and
//! a [`Relay`] that publishes what was staged, in order per ordering key, and marks it sent.
//!
//! # Guarantees
//!
//! * **Commit or nothing.** [`Outbox::stage`] writes one row of `samekey_outbox` on the connection
//!   of the caller's transaction: the message exists exactly when the business rows and the receipt
//!   (`PgStore::complete_in`, `MySqlStore::complete_in`, `SqliteStore::complete_in`) written in
//!   that transaction committed. A transaction rolled back, or a process that died before `COMMIT`,
//!   leaves none of the three, and the call's retry stages the message anew.
//! * **Staged once per message id.** The message id is `UNIQUE` (the last line of defence): staging
//!   the same message twice (a retried attempt of one call makes its messages with the same ids,
//!   see [`Envelope`]) keeps one row, and the second stage answers [`Staged::Duplicate`].
//! * **At least once, under a stable id.** Every staged message is published until a broker
//!   confirmed it ([`Publish`](crate::Publish)); a relay that dies between the broker's confirmation and marking the
//!   row sent leaves it unsent, and the next relay publishes it again **under the same message id**:
//!   the broker's duplicate window, or the consumer's [`Inbox`](crate::Inbox), drops the copy.
//! * **In order per ordering key.** A key's messages are published in the order they were staged
//!   (the row's sequence id; on PostgreSQL and MySQL, two transactions that stage under one key are
//!   ordered by their commits, see [`Outbox::stage`]): a relay takes only each key's oldest unsent
//!   message, and a key's next message waits until the one before is confirmed — also while that one
//!   fails.
//! * **Several relays share the table.** On PostgreSQL and MySQL each relay takes the heads of the
//!   keys `FOR UPDATE SKIP LOCKED` (a key whose head another relay holds is skipped, never
//!   overtaken); on SQLite a relay takes them under a lease judged by the database's clock, in one
//!   `UPDATE … RETURNING`.
//! * **Bounded.** [`Outbox::max_pending`] refuses a stage once that many messages wait
//!   ([`OutboxError::Full`], class `RateLimited`: the caller's transaction rolls back, nothing is
//!   lost); sent rows are deleted after [`Relay::keep_sent`].
//!
//! # Staging
//!
//! ```no_run
//! # #[cfg(feature = "postgres")] mod example {
//! use samekey_messaging::outbox::{OutboxError, PgOutbox};
//! use samekey_messaging::Envelope;
//! use samekey_runtime::sqlx;
//! use samekey_runtime::store::PgStore;
//!
//! # #[derive(Debug, thiserror::Error)] enum ChargeError {
//! #     #[error(transparent)] Db(#[from] sqlx::Error), #[error(transparent)] Outbox(#[from] OutboxError),
//! #     #[error(transparent)] Store(#[from] samekey_runtime::store::StoreError) }
//! // The body of an `#[idempotent]` call: the charge, its message and its receipt commit together.
//! async fn charge(outbox: &PgOutbox, order: i64) -> Result<i64, ChargeError> {
//!     let mut tx = outbox.pool().begin().await?;
//!     sqlx::query("INSERT INTO charges (order_id) VALUES ($1)").bind(order).execute(&mut *tx).await?;
//!     let charged = Envelope::new(order); // the call's callId and this message's number
//!     outbox.stage_envelope(&mut tx, "orders.charged", &order.to_string(), &charged).await?;
//!     PgStore::complete_in(&mut tx, &samekey_runtime::current(), &order).await?;
//!     tx.commit().await?;
//!     Ok(order)
//! }
//! # }
//! ```
//!
//! # The relay
//!
//! ```no_run
//! # #[cfg(feature = "postgres")] mod example {
//! use std::future::Future;
//!
//! use samekey_messaging::outbox::{PgOutbox, Relay};
//! use samekey_messaging::Publish;
//!
//! async fn relay(outbox: PgOutbox, broker: impl Publish, shutdown: impl Future<Output = ()>) {
//!     let relay = Relay::new(outbox, broker); // any publisher with confirmations
//!     relay.run(shutdown).await; // polls, publishes in order per key, marks sent, purges
//! }
//! # }
//! ```
//!
//! Run as many relays as you like, in as many processes: they share the table. [`Relay::run_once`]
//! publishes one batch and says what it did, for a loop of your own.
//!
//! # A broker down for an hour
//!
//! Nothing is lost and nothing stops the business transactions: while the broker is unreachable,
//! staged messages wait in `samekey_outbox` (the relay records each attempt's error in `attempts`
//! and `last_error` and backs off, up to [`Relay::max_backoff`]), and the table grows by the rate
//! at which messages are staged times the length of the outage — 100 messages a second for an hour
//! are 360 000 rows, about a hundred megabytes for messages of a few hundred bytes. Bound it with
//! [`Outbox::max_pending`] (say, the backlog you could publish in a few minutes, or what an hour of
//! outage stages when the disk allows): once that many wait, a stage is refused with
//! [`OutboxError::Full`] and its business transaction rolls back, so the caller sees back-pressure
//! instead of the database filling up. When the broker is back, the relay catches up oldest first,
//! each key in order; [`Outbox::pending`] and [`Outbox::oldest_pending_age`] show the backlog.
//!
//! A message the broker refuses ([`PublishError::Refused`](crate::PublishError::Refused): no queue
//! or stream for its destination) or does not confirm is retried too, under a growing per-message
//! delay ([`Relay::retry_backoff`]), and its key's later messages wait behind it: order is kept, and
//! the row's `attempts` and `last_error` say what blocks the key. Fix the destination (or delete the
//! row, giving the message up) and the key moves on.
//!
//! # Reading the table
//!
//! ```sql
//! -- What waits, oldest first, and why it has not gone yet:
//! SELECT id, ordering_key, message_id, destination, staged, attempts, last_error
//! FROM samekey_outbox WHERE sent IS NULL ORDER BY id LIMIT 20;
//! ```
//!
//! Times are the database's (`timestamptz` on PostgreSQL; `DATETIME(3)` in UTC on MySQL;
//! `YYYY-MM-DD HH:MM:SS.SSS` UTC text on SQLite), the headers JSON text (`[["x-call-id", "…"],
//! …]`), the body bytes. On MySQL the ordering key, the message id and the destination are
//! `VARBINARY(1024)` (compared byte for byte): a `mysql` client shows them as text, a program reads
//! them with `CONVERT(message_id USING utf8mb4)`.

mod relay;

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::fmt;
use std::time::Duration;

use samekey_runtime::sqlx::Pool;
use samekey_runtime::{Classify, ErrorClass};
use serde::Serialize;

use crate::envelope::Envelope;
use crate::message::Message;

pub use relay::{Batch, Relay};

/// The outbox on PostgreSQL (feature `postgres`).
#[cfg(feature = "postgres")]
pub type PgOutbox = Outbox<samekey_runtime::sqlx::Postgres>;

/// The outbox on MySQL 8 or MariaDB 10.6+ (feature `mysql`).
#[cfg(feature = "mysql")]
pub type MySqlOutbox = Outbox<samekey_runtime::sqlx::MySql>;

/// The outbox on SQLite (feature `sqlite`).
#[cfg(feature = "sqlite")]
pub type SqliteOutbox = Outbox<samekey_runtime::sqlx::Sqlite>;

/// Why the outbox did not do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// [`Outbox::max_pending`] messages already wait: the message was not staged. Roll the caller's
    /// transaction back (nothing of it commits, nothing is lost) and try later.
    #[error("the outbox is full: {max_pending} messages wait to be published")]
    Full {
        /// The bound that was reached.
        max_pending: u64,
    },
    /// The message could not be encoded (its envelope's payload, its headers).
    #[error("the message cannot be encoded: {0}")]
    Encode(String),
    /// An ordering key, a message id or a destination is longer than the database keeps (MySQL:
    /// 1 024 bytes each, so that they can be indexed and compared byte for byte): the message was
    /// not staged. Roll the caller's transaction back; the same message will never fit.
    #[error("the {field} is {len} bytes; this outbox keeps at most {max}")]
    TooLong {
        /// Which one: `"ordering key"`, `"message id"` or `"destination"`.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The most the database keeps.
        max: usize,
    },
    /// The database answered with an error (or not at all): a stage made in the caller's
    /// transaction did not happen, and that transaction must not commit as if it had.
    #[error("the outbox's database: {0}")]
    Database(#[from] samekey_runtime::sqlx::Error),
}

impl Classify for OutboxError {
    /// `Full` is [`ErrorClass::RateLimited`] (come back later: nothing was done), `Encode` is
    /// [`ErrorClass::Permanent`], `TooLong` is [`ErrorClass::Rejected`] (nothing was done, and
    /// trying again cannot help), `Database` is [`ErrorClass::Retryable`] (the caller's transaction
    /// did not commit).
    fn classify(&self) -> ErrorClass {
        match self {
            OutboxError::Full { .. } => ErrorClass::RateLimited { retry_after: None },
            OutboxError::Encode(_) => ErrorClass::Permanent,
            OutboxError::TooLong { .. } => ErrorClass::Rejected,
            OutboxError::Database(_) => ErrorClass::Retryable,
        }
    }
}

/// What [`Outbox::stage`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staged {
    /// The message is staged: it is published once the caller's transaction commits.
    New,
    /// A message with this id is already in the outbox (a retried attempt staged it again): nothing
    /// was added.
    Duplicate,
}

/// A transactional outbox in an SQL database ([`PgOutbox`], [`MySqlOutbox`], [`SqliteOutbox`]):
/// messages staged in
/// the caller's transactions, published by [`Relay`]s. See the [module documentation](self).
pub struct Outbox<DB: Backend> {
    pool: Pool<DB>,
    max_pending: Option<u64>,
}

impl<DB: Backend> Clone for Outbox<DB> {
    fn clone(&self) -> Self {
        Outbox {
            pool: self.pool.clone(),
            max_pending: self.max_pending,
        }
    }
}

impl<DB: Backend> fmt::Debug for Outbox<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox")
            .field("database", &<DB as samekey_runtime::sqlx::Database>::NAME)
            .field("max_pending", &self.max_pending)
            .finish()
    }
}

impl<DB: Backend> Outbox<DB> {
    /// The outbox in the database of `pool` (the pool your business transactions and the store use),
    /// without a bound on the messages that wait. Call [`Outbox::migrate`] once before use.
    pub fn from_pool(pool: Pool<DB>) -> Outbox<DB> {
        Outbox {
            pool,
            max_pending: None,
        }
    }

    /// Refuses a stage with [`OutboxError::Full`] once `n` messages wait to be published (default:
    /// no bound; see the [module documentation](self) for what an outage stages). The count is a
    /// bounded scan of the unsent rows' index (at most `n` entries), taken before the row is written:
    /// transactions staging at the same moment may each see `n - 1` and go a few over.
    pub fn max_pending(mut self, n: u64) -> Outbox<DB> {
        self.max_pending = Some(n);
        self
    }

    /// The connection pool.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// Creates the table `samekey_outbox` and its indexes if they are missing. Idempotent, and safe to
    /// run from several instances at once (on PostgreSQL under an advisory lock, on MySQL under
    /// `GET_LOCK`; an instance starting on a migrated database takes none).
    pub async fn migrate(&self) -> Result<(), OutboxError> {
        Ok(DB::migrate(&self.pool).await?)
    }

    /// Stages `message` on `conn` — the connection of the caller's transaction (`&mut tx`), beside the
    /// business rows and the receipt — under `ordering_key`: the relay publishes a key's messages in
    /// the order they were staged. Nothing is published unless that transaction commits.
    ///
    /// Staging a message whose id is already in the outbox changes nothing ([`Staged::Duplicate`]).
    /// Refused with [`OutboxError::Full`] when [`Outbox::max_pending`] messages wait, and with
    /// [`OutboxError::TooLong`] when the key, the id or the destination is longer than the database
    /// keeps (MySQL: 1 024 bytes): roll back.
    ///
    /// On PostgreSQL the stage takes a lock on the ordering key until the transaction ends
    /// (`pg_advisory_xact_lock`), so that two transactions staging under one key are published in the
    /// order they commit; a transaction that stages under several keys should take them in one order
    /// (by name), or two of them may deadlock — PostgreSQL then aborts one, which rolls back.
    ///
    /// On MySQL the stage locks its ordering key's bucket (`samekey_outbox_lock`, one of 1 000 rows
    /// picked by `CRC32(key) % 1000`) until the transaction ends, to the same end; two keys may share
    /// a bucket, so stage under several keys in one order (by bucket, or by name and accept that
    /// InnoDB may end a rare deadlock with error 1213, rolling one transaction back). A stage whose
    /// message id is there already leaves the transaction as it was (the duplicate-key error undoes
    /// the insert only).
    ///
    /// On SQLite, with [`Outbox::max_pending`] set, the stage reads before it writes: begin the
    /// transaction with a write (the business row) or `BEGIN IMMEDIATE`, as any SQLite transaction
    /// that reads then writes, or a concurrent writer may make it fail with `SQLITE_BUSY`.
    pub async fn stage(
        &self,
        conn: &mut DB::Connection,
        ordering_key: &str,
        message: &Message,
    ) -> Result<Staged, OutboxError> {
        if let Some(max) = DB::MAX_TEXT {
            let fields = [
                ("ordering key", ordering_key),
                ("message id", message.id.as_str()),
                ("destination", message.destination.as_str()),
            ];
            if let Some((field, value)) = fields.into_iter().find(|(_, v)| v.len() > max) {
                return Err(OutboxError::TooLong {
                    field,
                    len: value.len(),
                    max,
                });
            }
        }
        let headers = serde_json::to_string(&message.headers)
            .map_err(|e| OutboxError::Encode(e.to_string()))?;
        if let Some(max_pending) = self.max_pending {
            let waiting = DB::pending_up_to(&mut *conn, max_pending).await?;
            if waiting >= max_pending {
                tracing::warn!(target: "samekey", id = %message.id, max_pending,
                    "samekey: the outbox is full; the message is not staged");
                return Err(OutboxError::Full { max_pending });
            }
        }
        let inserted = DB::insert(conn, ordering_key, message, &headers).await?;
        tracing::debug!(target: "samekey", id = %message.id, ordering_key,
            destination = %message.destination, duplicate = !inserted, "samekey: message staged");
        Ok(if inserted {
            Staged::New
        } else {
            Staged::Duplicate
        })
    }

    /// Stages `envelope` for `destination` (a routing key, a subject) under `ordering_key`: its
    /// [message](Envelope::to_message), with the ids in the body and the headers, and its
    /// [`message_id`](Envelope::message_id) as the message id. See [`Outbox::stage`].
    pub async fn stage_envelope<T: Serialize>(
        &self,
        conn: &mut DB::Connection,
        destination: &str,
        ordering_key: &str,
        envelope: &Envelope<T>,
    ) -> Result<Staged, OutboxError> {
        let message = envelope
            .to_message(destination)
            .map_err(|e| OutboxError::Encode(e.to_string()))?;
        self.stage(conn, ordering_key, &message).await
    }

    /// How many staged messages wait to be published (committed, not yet confirmed by a broker).
    pub async fn pending(&self) -> Result<u64, OutboxError> {
        Ok(DB::pending(&self.pool).await?)
    }

    /// How long the oldest message that waits has waited, by the database's clock; `None` when
    /// nothing waits.
    pub async fn oldest_pending_age(&self) -> Result<Option<Duration>, OutboxError> {
        let age = DB::oldest_pending_age_ms(&self.pool).await?;
        Ok(age.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
    }
}

/// A database the outbox lives in: `sqlx::Postgres` (feature `postgres`), `sqlx::MySql` (feature
/// `mysql`) or `sqlx::Sqlite` (feature `sqlite`). Sealed: implemented in this crate only.
pub trait Backend: backend::Ops {}

pub(crate) mod backend {
    //! What each database does for the outbox: its statements (each in a `.sql` file of its folder)
    //! and how a relay takes, marks and gives back a batch.

    use std::future::Future;

    use samekey_runtime::sqlx::{self, Pool};

    use crate::message::Message;

    /// A staged message as a relay took it.
    #[derive(Debug)]
    pub struct Row {
        /// Its sequence id: the order.
        pub id: i64,
        /// Its ordering key.
        pub ordering_key: String,
        /// The message (`Err`: the row does not decode, why).
        pub message: Result<Message, String>,
        /// Publishes tried before.
        pub attempts: i64,
    }

    /// Decodes a row's headers (JSON: `[[name, value], …]`).
    fn headers_of(json: &str) -> Result<Vec<(String, String)>, String> {
        serde_json::from_str(json).map_err(|e| format!("the row's headers do not decode: {e}"))
    }

    /// A taken row, as every database answers it: the columns `id`, `ordering_key`, `message_id`,
    /// `destination`, `headers` (JSON text), `body` and `attempts`. A message that does not decode
    /// is a row all the same (its `message` says why), so that the relay can record it.
    pub fn row_of<R>(row: &R) -> Result<Row, sqlx::Error>
    where
        R: sqlx::Row,
        &'static str: sqlx::ColumnIndex<R>,
        for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        let headers: String = row.try_get("headers")?;
        let message = headers_of(&headers).and_then(|headers| {
            Ok(Message {
                id: row.try_get("message_id").map_err(|e| e.to_string())?,
                destination: row.try_get("destination").map_err(|e| e.to_string())?,
                headers,
                body: row.try_get("body").map_err(|e| e.to_string())?,
            })
        });
        Ok(Row {
            id: row.try_get("id")?,
            ordering_key: row.try_get("ordering_key")?,
            message,
            attempts: row.try_get("attempts")?,
        })
    }

    /// The outbox's operations on one database.
    pub trait Ops: sqlx::Database {
        /// A batch a relay took and has not finished: on PostgreSQL and MySQL its transaction (the
        /// rows locked), on SQLite its lease's token.
        type Taking: Send;

        /// The most bytes an ordering key, a message id or a destination may hold; `None`: any.
        const MAX_TEXT: Option<usize> = None;

        /// Creates the table and its indexes if missing.
        fn migrate(pool: &Pool<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

        /// How many messages wait, counting at most `limit`.
        fn pending_up_to(
            conn: &mut Self::Connection,
            limit: u64,
        ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

        /// Inserts a message, unless its id is there: whether a row was added.
        fn insert(
            conn: &mut Self::Connection,
            ordering_key: &str,
            message: &Message,
            headers: &str,
        ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

        /// How many messages wait.
        fn pending(pool: &Pool<Self>) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

        /// The age of the oldest message that waits, in ms by the database's clock.
        fn oldest_pending_age_ms(
            pool: &Pool<Self>,
        ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send;

        /// Takes up to `limit` heads of keys (each key's oldest unsent row, due, not held by another
        /// relay), for `lease_ms` where a lease is what holds them.
        fn take(
            pool: &Pool<Self>,
            limit: u32,
            lease_ms: u64,
            destinations: &str,
        ) -> impl Future<Output = Result<(Self::Taking, Vec<Row>), sqlx::Error>> + Send;

        /// Holds taken rows `ids` for another `lease_ms` (SQLite: the lease renewed; PostgreSQL:
        /// the transaction holds them): the ids still held.
        fn hold(
            taking: &mut Self::Taking,
            pool: &Pool<Self>,
            ids: &[i64],
            lease_ms: u64,
        ) -> impl Future<Output = Result<Vec<i64>, sqlx::Error>> + Send;

        /// Marks taken rows `ids` sent (deletes them when `delete`), in one statement.
        fn mark_sent(
            taking: &mut Self::Taking,
            pool: &Pool<Self>,
            ids: &[i64],
            delete: bool,
        ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

        /// Records a failed publish of a taken row; it is due again after `retry_ms` (0: at once).
        fn mark_failed(
            taking: &mut Self::Taking,
            pool: &Pool<Self>,
            id: i64,
            error: &str,
            retry_ms: u64,
        ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

        /// Ends a batch: commits its marks, gives back the rows it did not mark.
        fn finish(
            taking: Self::Taking,
            pool: &Pool<Self>,
        ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

        /// Deletes up to `limit` rows sent more than `keep_ms` ago: how many.
        fn purge(
            pool: &Pool<Self>,
            keep_ms: u64,
            limit: u32,
        ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
    }
}
