//! MySQL or MariaDB: two OS processes, each with its own runtime, over one database and the same keys
//! (the test binary starts itself twice as workers, one walking the keys up and one down, so that
//! they meet in the middle): each key's body runs once. Needs `SAMEKEY_MYSQL_URL`; without it the
//! test prints that it was skipped.
#![cfg(feature = "mysql")]

use std::process::Command;
use std::time::Duration;

use samekey_runtime::at_most_once::AtMostOnce;
use samekey_runtime::sqlx;
use samekey_runtime::store::MySqlStore;
use samekey_runtime::{Classify, Error, ErrorClass, Runtime};

const KEYS: u64 = 200;
const TABLE: &str = "SAMEKEY_WORKER_TABLE";
const START: &str = "SAMEKEY_WORKER_START";
const DOWN: &str = "SAMEKEY_WORKER_DOWN";

#[derive(Debug, thiserror::Error)]
enum WorkError {
    #[error("the effect was not written: {0}")]
    Effect(String),
    #[error(transparent)]
    Samekey(#[from] Error),
}

impl Classify for WorkError {
    fn classify(&self) -> ErrorClass {
        match self {
            WorkError::Effect(_) => ErrorClass::Permanent,
            WorkError::Samekey(e) => e.classify(),
        }
    }
}

static EFFECT: AtMostOnce = AtMostOnce::new("mysql_two_processes.effect");

fn unix_ms() -> u64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970");
    u64::try_from(since_epoch.as_millis()).expect("milliseconds fit a u64")
}

/// The worker half: runs only when started by the parent test with `SAMEKEY_WORKER_TABLE` set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_process() {
    let (Ok(effects), Ok(url)) = (std::env::var(TABLE), std::env::var("SAMEKEY_MYSQL_URL")) else {
        return;
    };
    let store = MySqlStore::connect(&url).await.expect("connect");
    let rt = Runtime::builder().store(store.clone()).build().unwrap();
    let start: u64 = std::env::var(START)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(start.saturating_sub(unix_ms()))).await;
    let down = std::env::var(DOWN).is_ok();
    for n in 0..KEYS {
        let key = if down { KEYS - 1 - n } else { n };
        let (store, effects) = (&store, &effects);
        let out: Result<u32, WorkError> = EFFECT
            .key(effects.as_str())
            .part(&key)
            .runtime(&rt)
            .run(|| async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO {effects} (k, pid) VALUES (?, ?)"
                )))
                .bind(key as i64)
                .bind(i64::from(std::process::id()))
                .execute(store.pool())
                .await
                .map_err(|e| WorkError::Effect(e.to_string()))?;
                Ok(std::process::id())
            })
            .await;
        out.expect("call");
    }
}

#[tokio::test]
async fn two_processes_race_and_each_key_runs_once() {
    let Ok(url) = std::env::var("SAMEKEY_MYSQL_URL") else {
        samekey_runtime::conformance::skipped(
            "set SAMEKEY_MYSQL_URL (scripts/services start) to run the MySQL tests",
        );
        return;
    };
    let store = MySqlStore::connect(&url).await.expect("connect");
    let effects = format!(
        "effects_{:016x}",
        samekey_runtime::TraceId::new().as_u128() as u64
    );
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {effects} (k BIGINT NOT NULL, pid BIGINT NOT NULL) ENGINE = InnoDB"
    )))
    .execute(store.pool())
    .await
    .expect("effects table");

    let exe = std::env::current_exe().expect("test binary");
    let start = (unix_ms() + 1_500).to_string();
    let spawn = |down: bool| {
        let mut command = Command::new(&exe);
        command
            .args(["--exact", "worker_process", "--nocapture"])
            .env(START, &start)
            .env(TABLE, &effects);
        if down {
            command.env(DOWN, "1");
        }
        command.spawn().expect("worker process")
    };
    let (mut up, mut down) = (spawn(false), spawn(true));
    let (up, down) = tokio::task::spawn_blocking(move || (up.wait(), down.wait()))
        .await
        .expect("join");
    assert!(up.expect("worker").success(), "the first worker failed");
    assert!(down.expect("worker").success(), "the second worker failed");

    let rows: Vec<(i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT k, COUNT(*) FROM {effects} GROUP BY k ORDER BY k"
    )))
    .fetch_all(store.pool())
    .await
    .expect("effects");
    let pids: Vec<(i64,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT DISTINCT pid FROM {effects}"
    )))
    .fetch_all(store.pool())
    .await
    .expect("pids");
    assert_eq!(rows.len() as u64, KEYS, "every key ran");
    let twice: Vec<_> = rows.iter().filter(|(_, n)| *n != 1).collect();
    assert!(twice.is_empty(), "keys that ran more than once: {twice:?}");
    println!("{} keys, executed by {} processes", rows.len(), pids.len());
    assert_eq!(pids.len(), 2, "both processes ran some keys: they raced");
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {effects}")))
        .execute(store.pool())
        .await
        .expect("drop the effects table");
}
