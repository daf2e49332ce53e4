//! Review of issue 28: `MySqlOutbox` attacked. Each test says in its doc comment what the finding
//! was and how it was fixed (FIXED), or that the attack held (HELD).
//!
//! Needs `SAMEKEY_MYSQL_URL`; each test uses a database of its own (`review28_…`), dropped at the end.
//!
//! FIXED (was high, build): with `--features mysql` alone `samekey_messaging::outbox` did not exist
//! (its gate named only `postgres` and `sqlite`); this file builds with `mysql` alone now.
#![cfg(feature = "mysql")]

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use samekey_messaging::outbox::{MySqlOutbox, Relay, Staged};
use samekey_messaging::{Message, Publish, PublishError};
use samekey_runtime::sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use samekey_runtime::sqlx::{self, AssertSqlSafe, Executor as _};

struct Db {
    outbox: MySqlOutbox,
    admin: sqlx::MySqlPool,
    database: String,
}

impl Db {
    async fn cleanup(self) {
        self.outbox.pool().close().await;
        let _ = sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {}",
            self.database
        )))
        .execute(&self.admin)
        .await;
    }
}

/// A database of this test's own; `sql_mode`, if given, is set on every connection of the pool
/// (what a server configured with that global `sql_mode` gives every session).
async fn open(test: &str, sql_mode: Option<&'static str>) -> Option<Db> {
    let Ok(url) = std::env::var("SAMEKEY_MYSQL_URL") else {
        samekey::conformance::skipped("set SAMEKEY_MYSQL_URL to run the MySQL review tests");
        return None;
    };
    let database = format!(
        "review28_{test}_{:x}",
        samekey::TraceId::new().as_u128() >> 80
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
    let options = MySqlConnectOptions::from_str(&url)
        .unwrap()
        .database(&database);
    let pool = MySqlPoolOptions::new()
        .max_connections(8)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if let Some(mode) = sql_mode {
                    conn.execute(AssertSqlSafe(format!("SET SESSION sql_mode = '{mode}'")))
                        .await?;
                }
                Ok(())
            })
        })
        .connect_with(options)
        .await
        .unwrap();
    let outbox = MySqlOutbox::from_pool(pool);
    outbox.migrate().await.unwrap();
    Some(Db {
        outbox,
        admin,
        database,
    })
}

fn message(id: &str, destination: &str, n: u32) -> Message {
    Message {
        id: id.to_owned(),
        destination: destination.to_owned(),
        headers: vec![("x-n".to_owned(), n.to_string())],
        body: n.to_string().into_bytes(),
    }
}

async fn stage(outbox: &MySqlOutbox, key: &str, m: &Message) -> Staged {
    let mut tx = outbox.pool().begin().await.unwrap();
    let staged = outbox.stage(&mut tx, key, m).await.unwrap();
    tx.commit().await.unwrap();
    staged
}

/// A publisher that records what it was handed, in order.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Message>>>);

impl Publish for Log {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        // A little latency, so that relays running at once overlap.
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.0.lock().unwrap().push(message.clone());
        Ok(())
    }
}

/// FIXED (was high, on a server whose `sql_mode` is not strict: `message_id` a `VARCHAR(255)`, a
/// longer id truncated, and two different messages whose ids shared their first 255 characters
/// staged as one — the second answered `Staged::Duplicate` and never published). The ids are
/// `VARBINARY(1024)` now, and a longer one is refused before anything is written.
#[tokio::test]
async fn long_message_ids_are_not_merged_in_non_strict_mode() {
    let Some(db) = open("longid", Some("NO_ENGINE_SUBSTITUTION")).await else {
        return;
    };
    let prefix = "m".repeat(255);
    let first = message(&format!("{prefix}-first"), "orders.placed", 0);
    let second = message(&format!("{prefix}-second"), "orders.placed", 1);
    let a = stage(&db.outbox, "k", &first).await;
    let b = stage(&db.outbox, "k2", &second).await;
    let pending = db.outbox.pending().await.unwrap();
    db.cleanup().await;
    assert_eq!(
        (a, b, pending),
        (Staged::New, Staged::New, 2),
        "two different messages: both must be staged (or refused with an error), never one \
         dropped as a duplicate"
    );
}

/// FIXED (was high, on a server whose `sql_mode` is not strict: `destination` a `VARCHAR(255)`, a
/// longer routing key or subject truncated, and the message published elsewhere). `VARBINARY(1024)`,
/// never truncated.
#[tokio::test]
async fn a_long_destination_is_published_where_it_was_staged_in_non_strict_mode() {
    let Some(db) = open("longdest", Some("NO_ENGINE_SUBSTITUTION")).await else {
        return;
    };
    let destination = format!("events.{}.created", "tenant".repeat(50));
    assert!(destination.len() > 255);
    let m = message("dest-1", &destination, 0);
    assert_eq!(stage(&db.outbox, "k", &m).await, Staged::New);
    let log = Log::default();
    let relay = Relay::new(db.outbox.clone(), log.clone());
    relay.run_once().await.unwrap();
    let published: Vec<String> = log
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|m| m.destination.clone())
        .collect();
    db.cleanup().await;
    assert_eq!(
        published,
        [destination],
        "published to the destination it was staged for"
    );
}

/// FIXED (was medium, default configuration: the text columns `utf8mb4_bin`, a `PAD SPACE`
/// collation, so the unique index held `"id-1"` and `"id-1 "` equal and dropped the second message
/// as a duplicate). `VARBINARY`: compared byte for byte, as on PostgreSQL.
#[tokio::test]
async fn message_ids_that_differ_by_a_trailing_space_are_two_messages() {
    let Some(db) = open("padspace", None).await else {
        return;
    };
    let a = stage(&db.outbox, "k", &message("id-1", "orders.placed", 0)).await;
    let b = stage(&db.outbox, "k", &message("id-1 ", "orders.placed", 1)).await;
    let pending = db.outbox.pending().await.unwrap();
    db.cleanup().await;
    assert_eq!((a, b, pending), (Staged::New, Staged::New, 2));
}

/// FIXED (was low-medium: an id, key or destination over 255 characters refused with error 1406,
/// classified `Retryable`, so an `#[idempotent]` body retried what could never succeed). Up to
/// 1 024 bytes stage as on PostgreSQL; a longer one is refused with `OutboxError::TooLong`,
/// `Rejected` (nothing was written; trying again cannot help), whatever the server's `sql_mode`.
#[tokio::test]
async fn a_long_ordering_key_stages_and_a_too_long_one_is_rejected() {
    let Some(db) = open("longkey", None).await else {
        return;
    };
    let key = format!("customer/{}", "x".repeat(300));
    let mut tx = db.outbox.pool().begin().await.unwrap();
    let staged = db
        .outbox
        .stage(&mut tx, &key, &message("lk-1", "orders.placed", 0))
        .await;
    let class = staged
        .as_ref()
        .err()
        .map(|e| format!("{:?}", samekey::Classify::classify(e)));
    drop(tx);
    db.cleanup().await;
    assert!(
        staged.is_ok(),
        "staged on PostgreSQL; on MySQL: {staged:?}, classified {class:?}"
    );

    let Some(db) = open("toolong", Some("NO_ENGINE_SUBSTITUTION")).await else {
        return;
    };
    for (key, id, destination) in [
        (
            "x".repeat(1025),
            "tl-1".to_owned(),
            "orders.placed".to_owned(),
        ),
        ("k".to_owned(), "i".repeat(1025), "orders.placed".to_owned()),
        ("k".to_owned(), "tl-3".to_owned(), "d".repeat(1025)),
    ] {
        let mut tx = db.outbox.pool().begin().await.unwrap();
        let refused = db
            .outbox
            .stage(&mut tx, &key, &message(&id, &destination, 0))
            .await
            .unwrap_err();
        assert!(
            matches!(
                refused,
                samekey_messaging::outbox::OutboxError::TooLong {
                    len: 1025,
                    max: 1024,
                    ..
                }
            ),
            "{refused:?}"
        );
        assert_eq!(
            samekey::Classify::classify(&refused),
            samekey::ErrorClass::Rejected
        );
        tx.commit().await.unwrap();
    }
    assert_eq!(db.outbox.pending().await.unwrap(), 0, "nothing written");
    db.cleanup().await;
}

/// HELD. Three relays running batches at once over one table, 40 keys of 6 messages each staged
/// while they run: every message is published, each exactly once (no relay overtakes a head another
/// holds, none publishes a key's later message while an earlier one waits), in its key's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn held_relays_interleaving_keep_each_keys_order_and_publish_once() {
    let Some(db) = open("relays", None).await else {
        return;
    };
    let log = Log::default();
    let stop = Arc::new(tokio::sync::Notify::new());
    let relays: Vec<_> = (0..3)
        .map(|_| {
            let relay = Relay::new(db.outbox.clone(), log.clone())
                .batch_size(7)
                .concurrency(3)
                .interval(Duration::from_millis(5));
            let stop = stop.clone();
            tokio::spawn(async move { relay.run(async move { stop.notified().await }).await })
        })
        .collect();
    let keys = 40u32;
    let per_key = 6u32;
    for n in 0..per_key {
        for k in 0..keys {
            let key = format!("key-{k}");
            let m = message(&format!("{key}/{n}"), "orders.placed", n);
            assert_eq!(stage(&db.outbox, &key, &m).await, Staged::New);
        }
    }
    let total = (keys * per_key) as usize;
    for _ in 0..1_000 {
        if log.0.lock().unwrap().len() >= total && db.outbox.pending().await.unwrap() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.notify_waiters();
    for r in relays {
        let _ = tokio::time::timeout(Duration::from_secs(10), r).await;
    }
    let published = log.0.lock().unwrap().clone();
    db.cleanup().await;
    let mut by_key: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for m in &published {
        let (key, n) = m.id.split_once('/').unwrap();
        by_key
            .entry(key.to_owned())
            .or_default()
            .push(n.parse().unwrap());
    }
    assert_eq!(published.len(), total, "each message published once");
    for (key, ns) in by_key {
        assert_eq!(ns, (0..per_key).collect::<Vec<_>>(), "order of {key}");
    }
}

/// HELD. A duplicate stage (error 1062) inside a transaction that has written a business row
/// leaves that transaction intact: the business row and a later stage commit.
#[tokio::test]
async fn held_a_duplicate_stage_leaves_the_business_row() {
    let Some(db) = open("dup", None).await else {
        return;
    };
    let pool = db.outbox.pool().clone();
    sqlx::raw_sql("CREATE TABLE biz (id BIGINT PRIMARY KEY) ENGINE = InnoDB")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        stage(&db.outbox, "k", &message("d-1", "o", 0)).await,
        Staged::New
    );
    let mut tx = pool.begin().await.unwrap();
    sqlx::raw_sql("INSERT INTO biz VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let again = db
        .outbox
        .stage(&mut tx, "k", &message("d-1", "o", 0))
        .await
        .unwrap();
    let next = db
        .outbox
        .stage(&mut tx, "k", &message("d-2", "o", 1))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM biz")
        .fetch_one(&pool)
        .await
        .unwrap();
    let pending = db.outbox.pending().await.unwrap();
    db.cleanup().await;
    assert_eq!(
        (again, next, rows, pending),
        (Staged::Duplicate, Staged::New, 1, 2)
    );
}
