//! The transactional outbox, on PostgreSQL (`SAMEKEY_PG_URL`, a schema of its own per test), MySQL
//! (`SAMEKEY_MYSQL_URL`, a database of its own per test) and SQLite (a temporary file), one suite run
//! on each: the business row, the message and the receipt
//! commit together or not at all; relays publish each key's messages in order, three at once; a
//! relay that dies before or after the publish leaves the message to the next, which publishes it
//! under the same id, and the consumer's inbox works it once; a broker outage keeps everything and
//! is caught up oldest first; a full outbox refuses the stage and the business transaction rolls
//! back; a refused message holds its key; sent rows are purged.
#![cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use samekey::{idempotent, Classify, ErrorClass, TraceId};
use samekey_messaging::{Delivery, Envelope, Handled, Inbox, Message, Publish, PublishError};
use tokio::sync::{watch, Notify};

/// What the in-memory broker does with the n-th publish it is asked for (from 0).
enum Fault {
    /// Takes the message and confirms.
    Deliver,
    /// Takes the message and confirms it after this long (a broker's round trip), so that relays
    /// running at once overlap.
    Slow(Duration),
    /// Answers this error; takes nothing.
    Fail(PublishError),
    /// Never answers, and takes nothing: the relay dies before its publish reached the broker.
    HangBefore,
    /// Takes the message, then never answers: the relay dies between the publish and its mark.
    HangAfter,
    /// Says so (`hung`), waits until the test opens the gate, then takes the message and confirms.
    Held,
}

type Plan = Box<dyn FnMut(u64, &Message) -> Fault + Send>;

/// An in-memory broker with confirmations and scripted faults: what it took, in order.
struct Broker {
    log: Mutex<Vec<Message>>,
    calls: AtomicU64,
    plan: Mutex<Plan>,
    taken: watch::Sender<usize>,
    hung: Notify,
    gate: Notify,
    in_flight: AtomicU64,
    most_in_flight: AtomicU64,
}

impl Broker {
    fn new(plan: impl FnMut(u64, &Message) -> Fault + Send + 'static) -> Arc<Broker> {
        Arc::new(Broker {
            log: Mutex::new(Vec::new()),
            calls: AtomicU64::new(0),
            plan: Mutex::new(Box::new(plan)),
            taken: watch::channel(0).0,
            hung: Notify::new(),
            gate: Notify::new(),
            in_flight: AtomicU64::new(0),
            most_in_flight: AtomicU64::new(0),
        })
    }

    fn reliable() -> Arc<Broker> {
        Broker::new(|_, _| Fault::Deliver)
    }

    fn take(&self, message: &Message) {
        let mut log = self.log.lock().unwrap();
        log.push(message.clone());
        self.taken.send_replace(log.len());
    }

    fn log(&self) -> Vec<Message> {
        self.log.lock().unwrap().clone()
    }

    /// Waits (bounded) until the broker took `n` messages.
    async fn wait_for(&self, n: usize) {
        let mut taken = self.taken.subscribe();
        let waited = tokio::time::timeout(Duration::from_secs(60), taken.wait_for(|&t| t >= n));
        assert!(
            matches!(waited.await, Ok(Ok(_))),
            "the broker took {} of {n} messages within 60 s",
            self.log.lock().unwrap().len()
        );
    }
}

impl Publish for Broker {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let fault = (self.plan.lock().unwrap())(n, message);
        match fault {
            Fault::Deliver => {
                self.take(message);
                Ok(())
            }
            Fault::Slow(latency) => {
                let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                self.most_in_flight.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(latency).await;
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                self.take(message);
                Ok(())
            }
            Fault::Fail(error) => Err(error),
            Fault::HangBefore => {
                self.hung.notify_one();
                std::future::pending().await
            }
            Fault::HangAfter => {
                self.take(message);
                self.hung.notify_one();
                std::future::pending().await
            }
            Fault::Held => {
                self.hung.notify_one();
                self.gate.notified().await;
                self.take(message);
                Ok(())
            }
        }
    }
}

/// A message of key `key`, number `n` (its body), with an id of its own.
fn message(key: &str, n: u32) -> Message {
    Message {
        id: format!("{key}/{n}"),
        destination: "orders.charged".to_owned(),
        headers: vec![("x-ordering-key".to_owned(), key.to_owned())],
        body: n.to_string().into_bytes(),
    }
}

/// The numbers the broker took for each key, in the order it took them.
fn by_key(log: &[Message]) -> HashMap<String, Vec<u32>> {
    let mut keys: HashMap<String, Vec<u32>> = HashMap::new();
    for m in log {
        let key = m.header("x-ordering-key").unwrap().to_owned();
        let n = std::str::from_utf8(&m.body).unwrap().parse().unwrap();
        keys.entry(key).or_default().push(n);
    }
    keys
}

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error("database: {0}")]
    Database(String),
    #[error("the process crashed before COMMIT")]
    Crashed,
    #[error(transparent)]
    Outbox(#[from] samekey_messaging::outbox::OutboxError),
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for ChargeError {
    fn classify(&self) -> ErrorClass {
        match self {
            ChargeError::Database(_) => ErrorClass::Retryable,
            // The transaction was dropped: nothing took effect, and the same key may run again.
            ChargeError::Crashed => ErrorClass::Rejected,
            ChargeError::Outbox(e) => e.classify(),
            ChargeError::Samekey(e) => e.classify(),
        }
    }
}

fn db(e: impl std::fmt::Display) -> ChargeError {
    ChargeError::Database(e.to_string())
}

#[derive(Debug, thiserror::Error)]
enum ShipError {
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for ShipError {
    fn classify(&self) -> ErrorClass {
        match self {
            ShipError::Samekey(e) => e.classify(),
        }
    }
}

/// Works every message the broker took through one inbox, as a consumer would: how many times the
/// handler ran per order, and each delivery's disposition.
async fn consume(rt: &samekey::Runtime, log: &[Message]) -> (HashMap<i64, u32>, Vec<String>) {
    let inbox = Inbox::new(format!("shipping.{:x}", TraceId::new().as_u128())).runtime(rt);
    let runs = Mutex::new(HashMap::<i64, u32>::new());
    let mut dispositions = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for m in log {
        let delivery = Delivery {
            body: &m.body,
            headers: &m.headers,
            message_id: Some(&m.id),
            delivery: None,
            redelivered: !seen.insert(m.id.clone()),
        };
        let runs = &runs;
        let handled = inbox
            .handle(&delivery, |order: i64| async move {
                *runs.lock().unwrap().entry(order).or_default() += 1;
                Ok::<_, ShipError>(format!("shipped {order}"))
            })
            .await;
        assert!(matches!(handled, Handled::Done(_)), "{handled:?}");
        dispositions.push(handled.disposition().name().to_owned());
    }
    (runs.into_inner().unwrap(), dispositions)
}

/// Polls `relay.run_once()` until the broker took `n` messages (bounded): for a lease to end, or a
/// dead relay's transaction to be rolled back.
async fn poll_until<DB, P>(
    relay: &samekey_messaging::outbox::Relay<DB, P>,
    broker: &Broker,
    n: usize,
) where
    DB: samekey_messaging::outbox::Backend,
    P: Publish,
{
    for _ in 0..400 {
        relay.run_once().await.unwrap();
        if broker.log().len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "the broker took {} of {n} messages after 400 polls",
        broker.log().len()
    );
}

#[cfg(feature = "postgres")]
mod pg_setup {
    use samekey_messaging::outbox::PgOutbox;
    use samekey_runtime::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    use samekey_runtime::store::PgStore;
    use std::str::FromStr;

    /// A database for one test: a schema of its own (`search_path`), so that tests running at once
    /// and reruns never see each other's rows; dropped at the end.
    pub struct Setup {
        pub outbox: PgOutbox,
        pub store: PgStore,
        schema: String,
    }

    impl Setup {
        pub async fn cleanup(self) {
            let statement = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema);
            let _ = samekey_runtime::sqlx::raw_sql(samekey_runtime::sqlx::AssertSqlSafe(statement))
                .execute(self.store.pool())
                .await;
        }
    }

    pub async fn open(test: &str) -> Option<Setup> {
        let Ok(url) = std::env::var("SAMEKEY_PG_URL") else {
            samekey::conformance::skipped(
                "set SAMEKEY_PG_URL (eval \"$(scripts/services start)\")",
            );
            return None;
        };
        let schema = format!(
            "outbox_{test}_{:x}",
            samekey::TraceId::new().as_u128() >> 64
        );
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .unwrap();
        samekey_runtime::sqlx::raw_sql(samekey_runtime::sqlx::AssertSqlSafe(format!(
            "CREATE SCHEMA {schema}"
        )))
        .execute(&admin)
        .await
        .unwrap();
        admin.close().await;
        let options = PgConnectOptions::from_str(&url)
            .unwrap()
            .options([("search_path", schema.as_str())]);
        let pool = PgPoolOptions::new()
            .max_connections(12)
            .connect_with(options)
            .await
            .unwrap();
        let store = PgStore::from_pool(pool.clone());
        store.migrate().await.unwrap();
        let outbox = PgOutbox::from_pool(pool);
        outbox.migrate().await.unwrap();
        // Twice: idempotent.
        outbox.migrate().await.unwrap();
        Some(Setup {
            outbox,
            store,
            schema,
        })
    }
}

#[cfg(feature = "mysql")]
mod mysql_setup {
    use samekey_messaging::outbox::MySqlOutbox;
    use samekey_runtime::sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
    use samekey_runtime::sqlx::{self, AssertSqlSafe};
    use samekey_runtime::store::MySqlStore;
    use std::str::FromStr;

    /// A database for one test: a database of its own, so that tests running at once and reruns
    /// never see each other's rows; dropped at the end.
    pub struct Setup {
        pub outbox: MySqlOutbox,
        pub store: MySqlStore,
        database: String,
    }

    impl Setup {
        pub async fn cleanup(self) {
            let statement = format!("DROP DATABASE IF EXISTS {}", self.database);
            let _ = sqlx::raw_sql(AssertSqlSafe(statement))
                .execute(self.store.pool())
                .await;
        }
    }

    pub async fn open(test: &str) -> Option<Setup> {
        let Ok(url) = std::env::var("SAMEKEY_MYSQL_URL") else {
            samekey::conformance::skipped(
                "set SAMEKEY_MYSQL_URL (eval \"$(scripts/services start)\")",
            );
            return None;
        };
        let database = format!(
            "outbox_{test}_{:x}",
            samekey::TraceId::new().as_u128() >> 64
        );
        let admin = MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .unwrap();
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {database}")))
            .execute(&admin)
            .await
            .unwrap();
        admin.close().await;
        let options = MySqlConnectOptions::from_str(&url)
            .unwrap()
            .database(&database);
        let pool = MySqlPoolOptions::new()
            .max_connections(12)
            .connect_with(options)
            .await
            .unwrap();
        let store = MySqlStore::from_pool(pool.clone());
        store.migrate().await.unwrap();
        let outbox = MySqlOutbox::from_pool(pool);
        outbox.migrate().await.unwrap();
        // Twice: idempotent.
        outbox.migrate().await.unwrap();
        Some(Setup {
            outbox,
            store,
            database,
        })
    }
}

#[cfg(feature = "sqlite")]
mod sqlite_setup {
    use samekey_messaging::outbox::SqliteOutbox;
    use samekey_runtime::store::SqliteStore;

    /// A database for one test: a file of its own, removed at the end.
    pub struct Setup {
        pub outbox: SqliteOutbox,
        pub store: SqliteStore,
        dir: std::path::PathBuf,
    }

    impl Setup {
        pub async fn cleanup(self) {
            self.store.pool().close().await;
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    pub async fn open(test: &str) -> Option<Setup> {
        let dir = std::env::temp_dir().join(format!(
            "samekey-outbox-{test}-{:x}",
            samekey::TraceId::new().as_u128()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let store = SqliteStore::open(dir.join("outbox.db")).await.unwrap();
        let outbox = SqliteOutbox::from_pool(store.pool().clone());
        outbox.migrate().await.unwrap();
        outbox.migrate().await.unwrap();
        Some(Setup { outbox, store, dir })
    }
}

/// The suite, for one database: `$setup` opens a database for a test, `$db` is its sqlx type,
/// `$store` the runtime's store on it; `$insert_charge` inserts a business row (its one parameter,
/// the order), `$headers` reads the staged row's headers as text, `$message_ids` the message ids of
/// ordering key `'1'`, in the database's dialect.
macro_rules! outbox_suite {
    (
        $name:ident, $setup:ident, $db:ty, $store:ty,
        $insert_charge:literal, $headers:literal, $message_ids:literal
    ) => {
        mod $name {
            use super::*;
            use samekey_messaging::outbox::{Outbox, OutboxError, Relay, Staged};
            use samekey_runtime::sqlx;

            type Db = $db;
            type Store = $store;

            fn runtime(store: &Store) -> samekey::Runtime {
                samekey::Runtime::builder()
                    .node("orders-1")
                    .store(store.clone())
                    .build()
                    .unwrap()
            }

            async fn count(outbox: &Outbox<Db>, sql: &'static str) -> i64 {
                sqlx::query_scalar(sql)
                    .fetch_one(outbox.pool())
                    .await
                    .unwrap()
            }

            /// Stages `message` under `key` in a transaction of its own, committed.
            async fn stage(outbox: &Outbox<Db>, key: &str, message: &Message) -> Staged {
                let mut tx = outbox.pool().begin().await.unwrap();
                let staged = outbox.stage(&mut *tx, key, message).await.unwrap();
                tx.commit().await.unwrap();
                staged
            }

            struct Orders {
                rt: samekey::Runtime,
                outbox: Outbox<Db>,
                crash: AtomicBool,
                runs: AtomicU32,
            }

            impl Orders {
                /// The charge, its "charged" message and its receipt, in one transaction; when
                /// `crash` is set, the process "dies" before COMMIT (the transaction is dropped).
                #[idempotent(key = "order", scope = "test.orders.charge", runtime = &self.rt)]
                async fn charge(&self, order: i64) -> Result<i64, ChargeError> {
                    self.runs.fetch_add(1, Ordering::SeqCst);
                    let mut tx = self.outbox.pool().begin().await.map_err(db)?;
                    sqlx::query($insert_charge)
                        .bind(order)
                        .execute(&mut *tx)
                        .await
                        .map_err(db)?;
                    let charged = Envelope::new(order);
                    self.outbox
                        .stage_envelope(&mut tx, "orders.charged", &order.to_string(), &charged)
                        .await?;
                    Store::complete_in(&mut tx, &samekey::current(), &order)
                        .await
                        .map_err(|e| ChargeError::Samekey(samekey::Error::Store(e)))?;
                    if self.crash.swap(false, Ordering::SeqCst) {
                        return Err(ChargeError::Crashed);
                    }
                    tx.commit().await.map_err(db)?;
                    Ok(order)
                }
            }

            async fn orders(outbox: &Outbox<Db>, store: &Store) -> Orders {
                sqlx::query("CREATE TABLE IF NOT EXISTS charges (order_id BIGINT PRIMARY KEY)")
                    .execute(outbox.pool())
                    .await
                    .unwrap();
                Orders {
                    rt: runtime(store),
                    outbox: outbox.clone(),
                    crash: AtomicBool::new(false),
                    runs: AtomicU32::new(0),
                }
            }

            /// (a) Committed: the charge, the receipt (SUCCESS) and the message, staged once under
            /// `<callId>/0`; the duplicate call replays and stages nothing. (b) Crashed before COMMIT:
            /// none of the three; the call's retry runs and stages once.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_message_commits_with_the_business_row_and_the_receipt_or_nothing_does() {
                let Some(setup) = $setup::open("commit").await else {
                    return;
                };
                let outbox = &setup.outbox;
                let orders = orders(outbox, &setup.store).await;

                let (charged, report) = samekey::observe::observed(orders.charge(1)).await;
                assert_eq!(charged.unwrap(), 1);
                let call_id = report.unwrap().call_id().clone();
                let receipt = orders.rt.receipt(&call_id).await.unwrap().unwrap();
                assert_eq!(receipt.state, samekey::ReceiptState::Success);
                assert_eq!(
                    count(outbox, "SELECT count(*) FROM charges WHERE order_id = 1").await,
                    1
                );
                let ids: Vec<String> = sqlx::query_scalar($message_ids)
                    .fetch_all(outbox.pool())
                    .await
                    .unwrap();
                assert_eq!(
                    ids,
                    [format!("{call_id}/0")],
                    "staged once, under the call's id"
                );
                assert_eq!(orders.charge(1).await.unwrap(), 1, "the duplicate replays");
                assert_eq!(orders.runs.load(Ordering::SeqCst), 1);
                assert_eq!(
                    outbox.pending().await.unwrap(),
                    1,
                    "nothing staged by the replay"
                );

                orders.crash.store(true, Ordering::SeqCst);
                let (crashed, report) = samekey::observe::observed(orders.charge(2)).await;
                assert!(matches!(crashed, Err(ChargeError::Crashed)), "{crashed:?}");
                let crashed_call = report.unwrap().call_id().clone();
                let receipt = orders.rt.receipt(&crashed_call).await.unwrap();
                assert!(
                    receipt.map(|r| r.state) != Some(samekey::ReceiptState::Success),
                    "no SUCCESS receipt without the business row"
                );
                assert_eq!(
                    count(outbox, "SELECT count(*) FROM charges WHERE order_id = 2").await,
                    0
                );
                assert_eq!(
                    count(
                        outbox,
                        "SELECT count(*) FROM samekey_outbox WHERE ordering_key = '2'"
                    )
                    .await,
                    0,
                    "no message without the business row"
                );
                assert_eq!(orders.charge(2).await.unwrap(), 2, "the retry runs");
                assert_eq!(
                    count(outbox, "SELECT count(*) FROM charges WHERE order_id = 2").await,
                    1
                );
                assert_eq!(
                    count(
                        outbox,
                        "SELECT count(*) FROM samekey_outbox WHERE ordering_key = '2'"
                    )
                    .await,
                    1,
                    "staged once"
                );
                assert_eq!(outbox.pending().await.unwrap(), 2);
                setup.cleanup().await;
            }

            /// The message id is UNIQUE: a second stage of one message keeps one row.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn staging_a_message_twice_keeps_one_row() {
                let Some(setup) = $setup::open("twice").await else {
                    return;
                };
                let outbox = &setup.outbox;
                let m = message("k", 0);
                assert_eq!(stage(outbox, "k", &m).await, Staged::New);
                assert_eq!(stage(outbox, "k", &m).await, Staged::Duplicate);
                assert_eq!(
                    count(outbox, "SELECT count(*) FROM samekey_outbox").await,
                    1
                );
                let staged: String = sqlx::query_scalar($headers)
                    .fetch_one(outbox.pool())
                    .await
                    .unwrap();
                assert!(
                    staged.contains("x-ordering-key"),
                    "headers as JSON text: {staged}"
                );
                setup.cleanup().await;
            }

            /// Three relays at once over 12 keys of 8 messages, half staged before they start and half
            /// while they run: every message published once, each key's in staging order.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn three_relays_publish_every_message_once_in_order_per_key() {
                let Some(setup) = $setup::open("three").await else {
                    return;
                };
                let outbox = &setup.outbox;
                let broker = Broker::new(|_, _| Fault::Slow(Duration::from_millis(2)));
                let (keys, per_key) = (12u32, 8u32);
                let total = (keys * per_key) as usize;
                // Each key's first half one after the other (a relay that took more than a key's
                // head would take several of one key), the second half round-robin.
                for k in 0..keys {
                    for n in 0..per_key / 2 {
                        stage(
                            outbox,
                            &format!("key-{k}"),
                            &message(&format!("key-{k}"), n),
                        )
                        .await;
                    }
                }
                let (stop, stopped) = watch::channel(false);
                let mut relays = Vec::new();
                for _ in 0..3 {
                    let relay = Relay::new(outbox.clone(), broker.clone())
                        .batch_size(3)
                        .interval(Duration::from_millis(5));
                    let mut stopped = stopped.clone();
                    relays.push(tokio::spawn(async move {
                        relay
                            .run(async move {
                                let _ = stopped.wait_for(|&s| s).await;
                            })
                            .await
                    }));
                }
                for n in per_key / 2..per_key {
                    for k in 0..keys {
                        stage(
                            outbox,
                            &format!("key-{k}"),
                            &message(&format!("key-{k}"), n),
                        )
                        .await;
                    }
                }
                broker.wait_for(total).await;
                stop.send_replace(true);
                for relay in relays {
                    relay.await.unwrap();
                }
                let log = broker.log();
                assert_eq!(log.len(), total, "every message once");
                for (key, numbers) in by_key(&log) {
                    assert_eq!(numbers, (0..per_key).collect::<Vec<_>>(), "{key} in order");
                }
                assert_eq!(outbox.pending().await.unwrap(), 0);
                setup.cleanup().await;
            }

            /// A relay dies after the broker took the message, before marking it sent: the next relay
            /// publishes it again, under the same id, and the consumer's inbox works it once.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_relay_killed_between_publish_and_mark_publishes_again_under_the_same_id() {
                let Some(setup) = $setup::open("aftermark").await else {
                    return;
                };
                let outbox = &setup.outbox;
                let rt = runtime(&setup.store);
                let charged = Envelope::new(7i64);
                let mut tx = outbox.pool().begin().await.unwrap();
                outbox
                    .stage_envelope(&mut tx, "orders.charged", "7", &charged)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                let broker = Broker::new(|n, _| {
                    if n == 0 {
                        Fault::HangAfter
                    } else {
                        Fault::Deliver
                    }
                });
                let dying =
                    Relay::new(outbox.clone(), broker.clone()).lease(Duration::from_millis(300));
                tokio::select! {
                    done = dying.run_once() => panic!("the publish never answers: {done:?}"),
                    _ = broker.hung.notified() => {} // the relay is killed here
                }
                drop(dying);
                assert_eq!(outbox.pending().await.unwrap(), 1, "not marked sent");
                let next = Relay::new(outbox.clone(), broker.clone());
                poll_until(&next, &broker, 2).await;
                let log = broker.log();
                assert_eq!(log.len(), 2, "published twice");
                assert_eq!(log[0].id, charged.message_id());
                assert_eq!(log[1].id, log[0].id, "under the same id");
                assert_eq!(log[1].body, log[0].body);
                assert_eq!(outbox.pending().await.unwrap(), 0);
                let (runs, dispositions) = consume(&rt, &log).await;
                assert_eq!(runs, HashMap::from([(7, 1)]), "worked once");
                assert_eq!(dispositions, ["ack", "ack"]);
                setup.cleanup().await;
            }

            /// A relay dies before its publish reached the broker: the next one publishes it, once.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_relay_killed_before_publishing_leaves_the_message_to_the_next() {
                let Some(setup) = $setup::open("beforepub").await else {
                    return;
                };
                let outbox = &setup.outbox;
                stage(outbox, "k", &message("k", 0)).await;
                stage(outbox, "k", &message("k", 1)).await;
                let broker = Broker::new(|n, _| {
                    if n == 0 {
                        Fault::HangBefore
                    } else {
                        Fault::Deliver
                    }
                });
                let dying =
                    Relay::new(outbox.clone(), broker.clone()).lease(Duration::from_millis(300));
                tokio::select! {
                    done = dying.run_once() => panic!("the publish never answers: {done:?}"),
                    _ = broker.hung.notified() => {}
                }
                drop(dying);
                let next = Relay::new(outbox.clone(), broker.clone());
                poll_until(&next, &broker, 2).await;
                let log = broker.log();
                assert_eq!(by_key(&log)["k"], [0, 1], "each once, in order");
                assert_eq!(outbox.pending().await.unwrap(), 0);
                setup.cleanup().await;
            }

            /// The broker is unreachable for 40 polls while messages keep being staged: nothing is
            /// published or lost, the backlog and its age grow, the head's attempts are recorded;
            /// then the relay catches up, oldest first, each key in order.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_broker_outage_keeps_every_message_and_is_caught_up_in_order() {
                let Some(setup) = $setup::open("outage").await else {
                    return;
                };
                let outbox = &setup.outbox;
                let down = Arc::new(AtomicBool::new(true));
                let broker = {
                    let down = down.clone();
                    Broker::new(move |_, _| {
                        if down.load(Ordering::SeqCst) {
                            Fault::Fail(PublishError::Unavailable("connection refused".into()))
                        } else {
                            Fault::Deliver
                        }
                    })
                };
                // One publish at a time: a batch stops at the first that finds the broker down.
                let relay = Relay::new(outbox.clone(), broker.clone())
                    .batch_size(8)
                    .concurrency(1);
                let mut staged = 0u32;
                for poll in 0..40u32 {
                    let key = format!("key-{}", poll % 3);
                    stage(outbox, &key, &message(&key, poll / 3)).await;
                    staged += 1;
                    let batch = relay.run_once().await.unwrap();
                    assert!(batch.broker_down, "poll {poll}: {batch:?}");
                    assert_eq!(batch.published, 0);
                    assert_eq!(batch.failed, 1, "one try per poll while the broker is down");
                    assert_eq!(outbox.pending().await.unwrap(), u64::from(staged));
                }
                assert!(broker.log().is_empty());
                assert!(broker.calls.load(Ordering::SeqCst) >= 40);
                assert!(outbox.oldest_pending_age().await.unwrap().is_some());
                let (attempts, error): (i64, Option<String>) = sqlx::query_as(
                    "SELECT attempts, last_error FROM samekey_outbox ORDER BY id LIMIT 1",
                )
                .fetch_one(outbox.pool())
                .await
                .unwrap();
                assert!(attempts >= 1, "the head's attempts are recorded");
                assert!(error.unwrap_or_default().contains("connection refused"));

                down.store(false, Ordering::SeqCst);
                poll_until(&relay, &broker, staged as usize).await;
                let log = broker.log();
                assert_eq!(log.len(), staged as usize, "nothing lost, nothing twice");
                assert_eq!(log[0].id, "key-0/0", "the oldest first");
                for (key, numbers) in by_key(&log) {
                    let expected = (0..numbers.len() as u32).collect::<Vec<_>>();
                    assert_eq!(numbers, expected, "{key} in order");
                }
                assert_eq!(outbox.pending().await.unwrap(), 0);
                assert_eq!(outbox.oldest_pending_age().await.unwrap(), None);
                setup.cleanup().await;
            }

            /// `max_pending(3)`: the fourth stage is refused with `Full` (RateLimited), its business
            /// row rolls back with it; once one is published, staging goes on.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_full_outbox_refuses_the_stage_and_the_business_transaction_rolls_back() {
                let Some(setup) = $setup::open("full").await else {
                    return;
                };
                let outbox = setup.outbox.clone().max_pending(3);
                sqlx::query("CREATE TABLE IF NOT EXISTS charges (order_id BIGINT PRIMARY KEY)")
                    .execute(outbox.pool())
                    .await
                    .unwrap();
                for n in 0..3 {
                    stage(&outbox, "k", &message("k", n)).await;
                }
                let business = async {
                    let mut tx = outbox.pool().begin().await.map_err(db)?;
                    sqlx::query("INSERT INTO charges (order_id) VALUES (42)")
                        .execute(&mut *tx)
                        .await
                        .map_err(db)?;
                    outbox.stage(&mut *tx, "k", &message("k", 3)).await?;
                    tx.commit().await.map_err(db)?;
                    Ok::<_, ChargeError>(())
                };
                let refused = business.await;
                match &refused {
                    Err(ChargeError::Outbox(e @ OutboxError::Full { max_pending: 3 })) => {
                        assert!(matches!(e.classify(), ErrorClass::RateLimited { .. }));
                    }
                    other => panic!("expected Full, got {other:?}"),
                }
                assert_eq!(
                    count(&outbox, "SELECT count(*) FROM charges").await,
                    0,
                    "rolled back"
                );
                assert_eq!(outbox.pending().await.unwrap(), 3);
                let broker = Broker::reliable();
                let relay = Relay::new(outbox.clone(), broker.clone());
                assert_eq!(relay.run_once().await.unwrap().published, 1);
                assert_eq!(stage(&outbox, "k", &message("k", 3)).await, Staged::New);
                setup.cleanup().await;
            }

            /// A message the broker refuses holds its key (the key's next waits, with its
            /// `attempts` and `last_error` in the row) while other keys go on; once due again it is
            /// published, then the key's next.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_refused_message_holds_its_key_and_is_retried() {
                let Some(setup) = $setup::open("refused").await else {
                    return;
                };
                let outbox = &setup.outbox;
                stage(outbox, "a", &message("a", 0)).await;
                stage(outbox, "a", &message("a", 1)).await;
                stage(outbox, "b", &message("b", 0)).await;
                let broker = Broker::new(|_, m| {
                    if m.id == "a/0" && !REFUSED_ONCE.swap(true, Ordering::SeqCst) {
                        Fault::Fail(PublishError::Refused {
                            id: m.id.clone(),
                            reason: "no queue".into(),
                        })
                    } else {
                        Fault::Deliver
                    }
                });
                static REFUSED_ONCE: AtomicBool = AtomicBool::new(false);
                let relay = Relay::new(outbox.clone(), broker.clone())
                    .retry_backoff(Duration::from_secs(3600), Duration::from_secs(3600));
                let first = relay.run_once().await.unwrap();
                assert_eq!(
                    (first.taken, first.published, first.failed),
                    (2, 1, 1),
                    "{first:?}"
                );
                assert!(!first.broker_down);
                let second = relay.run_once().await.unwrap();
                assert_eq!(
                    second.taken, 0,
                    "a/0 waits for its retry, and a/1 behind it"
                );
                let (attempts, error): (i64, Option<String>) = sqlx::query_as(
                    "SELECT attempts, last_error FROM samekey_outbox WHERE message_id = 'a/0'",
                )
                .fetch_one(outbox.pool())
                .await
                .unwrap();
                assert_eq!(attempts, 1);
                assert!(error.unwrap_or_default().contains("no queue"));
                // The operator fixes the destination: the message is due again.
                sqlx::query("UPDATE samekey_outbox SET next_at = NULL")
                    .execute(outbox.pool())
                    .await
                    .unwrap();
                poll_until(&relay, &broker, 3).await;
                let keys = by_key(&broker.log());
                assert_eq!(keys["a"], [0, 1]);
                assert_eq!(keys["b"], [0]);
                setup.cleanup().await;
            }

            /// A publisher that never answers is given up after `publish_timeout` (Unconfirmed,
            /// recorded in the row), and the message is published again, under the same id.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_publish_that_never_answers_is_timed_out_and_tried_again() {
                let Some(setup) = $setup::open("timeout").await else {
                    return;
                };
                let outbox = &setup.outbox;
                stage(outbox, "k", &message("k", 0)).await;
                let broker = Broker::new(|n, _| {
                    if n == 0 {
                        Fault::HangBefore
                    } else {
                        Fault::Deliver
                    }
                });
                let relay = Relay::new(outbox.clone(), broker.clone())
                    .publish_timeout(Duration::from_millis(50))
                    .retry_backoff(Duration::ZERO, Duration::ZERO);
                let first = relay.run_once().await.unwrap();
                assert_eq!(
                    (first.taken, first.published, first.failed),
                    (1, 0, 1),
                    "{first:?}"
                );
                let error: Option<String> =
                    sqlx::query_scalar("SELECT last_error FROM samekey_outbox")
                        .fetch_one(outbox.pool())
                        .await
                        .unwrap();
                assert!(error.unwrap_or_default().contains("no confirmation"));
                assert_eq!(relay.run_once().await.unwrap().published, 1);
                assert_eq!(broker.log()[0].id, "k/0");
                assert_eq!(outbox.pending().await.unwrap(), 0);
                setup.cleanup().await;
            }

            /// A head one relay is publishing is held: another relay takes neither it nor its key's
            /// next message (nor the other heads of the first batch), and the key's order holds.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_head_another_relay_holds_is_skipped_and_never_overtaken() {
                let Some(setup) = $setup::open("held").await else {
                    return;
                };
                let outbox = &setup.outbox;
                stage(outbox, "k", &message("k", 0)).await;
                stage(outbox, "k", &message("k", 1)).await;
                stage(outbox, "j", &message("j", 0)).await;
                let broker = Broker::new(|n, _| if n == 0 { Fault::Held } else { Fault::Deliver });
                let first = Relay::new(outbox.clone(), broker.clone()).concurrency(1);
                let second = Relay::new(outbox.clone(), broker.clone());
                let holding = async {
                    let batch = first.run_once().await.unwrap();
                    assert_eq!((batch.taken, batch.published), (2, 2), "{batch:?}");
                };
                let meanwhile = async {
                    broker.hung.notified().await; // the first relay is publishing "k/0"
                    let batch = second.run_once().await.unwrap();
                    broker.gate.notify_one();
                    batch
                };
                let ((), batch) = tokio::join!(holding, meanwhile);
                assert_eq!(
                    batch.taken, 0,
                    "the heads are held, k/1 is no head: {batch:?}"
                );
                poll_until(&second, &broker, 3).await;
                assert_eq!(by_key(&broker.log())["k"], [0, 1]);
                assert_eq!(outbox.pending().await.unwrap(), 0);
                setup.cleanup().await;
            }

            /// A batch's heads are of distinct keys, published `concurrency` at once.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_batch_publishes_its_heads_concurrency_at_once() {
                let Some(setup) = $setup::open("concurrent").await else {
                    return;
                };
                let outbox = &setup.outbox;
                for k in 0..8 {
                    stage(
                        outbox,
                        &format!("key-{k}"),
                        &message(&format!("key-{k}"), 0),
                    )
                    .await;
                }
                let broker = Broker::new(|_, _| Fault::Slow(Duration::from_millis(20)));
                let relay = Relay::new(outbox.clone(), broker.clone()).concurrency(4);
                let batch = relay.run_once().await.unwrap();
                assert_eq!((batch.taken, batch.published), (8, 8), "{batch:?}");
                assert_eq!(broker.most_in_flight.load(Ordering::SeqCst), 4);
                setup.cleanup().await;
            }

            /// Sent rows: kept for `keep_sent` (readable, `sent` set), deleted past it; deleted at
            /// once with `keep_sent(0)`.
            #[tokio::test]
            async fn a_relay_takes_only_its_destinations_and_order_holds_across_them() {
                let Some(setup) = $setup::open("destinations").await else {
                    return;
                };
                let outbox = &setup.outbox;
                let to = |destination: &str, key: &str, n: u32| Message {
                    destination: destination.to_owned(),
                    ..message(key, n)
                };
                // One key, a message for each broker in turn; another key for the second only.
                stage(outbox, "k", &to("amqp.orders", "k", 0)).await;
                stage(outbox, "k", &to("nats.orders", "k", 1)).await;
                stage(outbox, "j", &to("nats.orders", "j", 0)).await;
                let amqp = Broker::reliable();
                let nats = Broker::reliable();
                let amqp_relay = Relay::new(outbox.clone(), amqp.clone()).destinations("amqp.");
                let nats_relay = Relay::new(outbox.clone(), nats.clone()).destinations("nats.");
                // The NATS relay may take j's message, but not k's second before k's first is out.
                nats_relay.run_once().await.unwrap();
                let ids = |b: &Broker| b.log().into_iter().map(|m| m.id).collect::<Vec<_>>();
                assert_eq!(
                    ids(&nats),
                    ["j/0"],
                    "k/1 waits behind k/0, which is not NATS's"
                );
                amqp_relay.run_once().await.unwrap();
                assert_eq!(ids(&amqp), ["k/0"], "never another broker's message");
                nats_relay.run_once().await.unwrap();
                assert_eq!(ids(&nats), ["j/0", "k/1"]);
                setup.cleanup().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sent_rows_are_purged_after_keep_sent() {
                let Some(setup) = $setup::open("purge").await else {
                    return;
                };
                let outbox = &setup.outbox;
                let broker = Broker::reliable();
                stage(outbox, "k", &message("k", 0)).await;
                let keeping = Relay::new(outbox.clone(), broker.clone());
                assert_eq!(keeping.run_once().await.unwrap().published, 1);
                assert_eq!(
                    count(
                        outbox,
                        "SELECT count(*) FROM samekey_outbox WHERE sent IS NOT NULL"
                    )
                    .await,
                    1,
                    "kept, marked sent"
                );
                let purging =
                    Relay::new(outbox.clone(), broker.clone()).keep_sent(Duration::from_millis(1));
                let mut purged = 0;
                for _ in 0..100 {
                    purged += purging.run_once().await.unwrap().purged;
                    if purged > 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                assert_eq!(purged, 1);
                let at_once = Relay::new(outbox.clone(), broker.clone()).keep_sent(Duration::ZERO);
                stage(outbox, "k", &message("k", 1)).await;
                assert_eq!(at_once.run_once().await.unwrap().published, 1);
                assert_eq!(
                    count(outbox, "SELECT count(*) FROM samekey_outbox").await,
                    0
                );
                setup.cleanup().await;
            }
        }
    };
}

#[cfg(feature = "postgres")]
outbox_suite!(
    postgres,
    pg_setup,
    samekey_runtime::sqlx::Postgres,
    samekey_runtime::store::PgStore,
    "INSERT INTO charges (order_id) VALUES ($1)",
    "SELECT CAST(headers AS TEXT) FROM samekey_outbox",
    "SELECT message_id FROM samekey_outbox WHERE ordering_key = '1'"
);

#[cfg(feature = "mysql")]
outbox_suite!(
    mysql,
    mysql_setup,
    samekey_runtime::sqlx::MySql,
    samekey_runtime::store::MySqlStore,
    "INSERT INTO charges (order_id) VALUES (?)",
    "SELECT headers FROM samekey_outbox",
    // Bytes (VARBINARY), read as text.
    "SELECT CONVERT(message_id USING utf8mb4) FROM samekey_outbox WHERE ordering_key = '1'"
);

#[cfg(feature = "sqlite")]
outbox_suite!(
    sqlite,
    sqlite_setup,
    samekey_runtime::sqlx::Sqlite,
    samekey_runtime::store::SqliteStore,
    "INSERT INTO charges (order_id) VALUES ($1)",
    "SELECT CAST(headers AS TEXT) FROM samekey_outbox",
    "SELECT message_id FROM samekey_outbox WHERE ordering_key = '1'"
);

/// Two transactions staging under one key are published in the order they commit: the second
/// waits for the first's lock on the key (`$waiting`, a query of the database's locks or processes,
/// counts the waiter), so it cannot commit a later message with an earlier id, and a relay in
/// between publishes nothing out of order. A message staged again in a transaction that goes on
/// undoes nothing of it.
macro_rules! stagings_are_ordered_by_their_commits {
    ($test:ident, $setup:ident, $feature:literal, $waiting:literal) => {
        #[cfg(feature = $feature)]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            use samekey_messaging::outbox::{Relay, Staged};
            use samekey_runtime::sqlx;

            let Some(setup) = $setup::open("lockkey").await else {
                return;
            };
            let outbox = setup.outbox.clone();
            let mut first = outbox.pool().begin().await.unwrap();
            outbox
                .stage(&mut first, "k", &message("k", 0))
                .await
                .unwrap();
            let second = tokio::spawn({
                let outbox = outbox.clone();
                async move {
                    let mut tx = outbox.pool().begin().await.unwrap();
                    outbox.stage(&mut tx, "k", &message("k", 1)).await.unwrap();
                    tx.commit().await.unwrap();
                }
            });
            // Bounded: the second stage waits for the first transaction's lock on the key.
            let mut waiting = 0i64;
            for _ in 0..400 {
                waiting = sqlx::query_scalar($waiting)
                    .fetch_one(outbox.pool())
                    .await
                    .unwrap();
                if waiting > 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(waiting > 0, "the second stage waits for the key");
            let broker = Broker::reliable();
            let relay = Relay::new(outbox.clone(), broker.clone());
            assert_eq!(
                relay.run_once().await.unwrap().taken,
                0,
                "nothing committed yet"
            );
            first.commit().await.unwrap();
            second.await.unwrap();
            poll_until(&relay, &broker, 2).await;
            assert_eq!(by_key(&broker.log())["k"], [0, 1]);
            let mut tx = outbox.pool().begin().await.unwrap();
            let again = outbox.stage(&mut tx, "k", &message("k", 0)).await.unwrap();
            assert_eq!(again, Staged::Duplicate);
            outbox.stage(&mut tx, "k", &message("k", 2)).await.unwrap();
            tx.commit().await.unwrap();
            poll_until(&relay, &broker, 3).await;
            assert_eq!(by_key(&broker.log())["k"], [0, 1, 2]);
            setup.cleanup().await;
        }
    };
}

// PostgreSQL: an advisory lock on the key, seen waiting in pg_locks.
stagings_are_ordered_by_their_commits!(
    postgres_stagings_under_one_key_are_ordered_by_their_commits,
    pg_setup,
    "postgres",
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
);

// MySQL: a row lock on the key's bucket, its statement seen running in the process list.
stagings_are_ordered_by_their_commits!(
    mysql_stagings_under_one_key_are_ordered_by_their_commits,
    mysql_setup,
    "mysql",
    "SELECT COUNT(*) FROM information_schema.processlist \
     WHERE db = DATABASE() AND id <> CONNECTION_ID() \
         AND info LIKE '%FROM samekey_outbox_lock%FOR UPDATE%'"
);

/// On SQLite, a batch renews its lease before each group of publishes, and leaves the rows another
/// relay took once its lease ended: it does not publish them again.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_batch_whose_lease_ended_leaves_the_rows_another_relay_took() {
    use samekey_messaging::outbox::Relay;
    use samekey_runtime::sqlx;

    let Some(setup) = sqlite_setup::open("lease").await else {
        return;
    };
    let outbox = setup.outbox.clone();
    for key in ["a", "b"] {
        let mut tx = outbox.pool().begin().await.unwrap();
        outbox.stage(&mut tx, key, &message(key, 0)).await.unwrap();
        tx.commit().await.unwrap();
    }
    let broker = Broker::new(|n, _| if n == 0 { Fault::Held } else { Fault::Deliver });
    let slow = Relay::new(outbox.clone(), broker.clone()).concurrency(1);
    let other = Relay::new(outbox.clone(), broker.clone());
    let slow_batch = async {
        let batch = slow.run_once().await.unwrap();
        assert_eq!(
            (batch.taken, batch.published, batch.left),
            (2, 1, 1),
            "{batch:?}"
        );
    };
    let meanwhile = async {
        broker.hung.notified().await; // the slow relay is publishing "a/0"
                                      // Its lease ends (a publish slower than the lease): the other relay takes both heads.
        sqlx::query("UPDATE samekey_outbox SET lease_until = '2000-01-01 00:00:00.000'")
            .execute(outbox.pool())
            .await
            .unwrap();
        let batch = other.run_once().await.unwrap();
        broker.gate.notify_one();
        batch
    };
    let ((), other_batch) = tokio::join!(slow_batch, meanwhile);
    assert_eq!(other_batch.published, 2, "{other_batch:?}");
    let log = broker.log();
    let ids: Vec<&str> = log.iter().map(|m| m.id.as_str()).collect();
    // "a/0" twice under its id (the window a lease shorter than a publish opens); "b/0", which the
    // slow relay no longer held when it came to it, once.
    assert_eq!(ids, ["a/0", "b/0", "a/0"]);
    assert_eq!(outbox.pending().await.unwrap(), 0);
    setup.cleanup().await;
}
