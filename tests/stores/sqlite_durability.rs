//! SQLite: a restart replays instead of re-executing, and two OS processes racing on the same keys
//! execute each key exactly once.
#![cfg(feature = "sqlite")]

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use samekey::sqlx;
use samekey::store::SqliteStore;
use samekey::{idempotent, Runtime};
use support::TestError;

fn db_path(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("sqlite-{name}-{}", samekey::TraceId::new()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join("samekey.db")
}

struct Orders {
    rt: Runtime,
    executions: AtomicU32,
}

impl Orders {
    async fn open(path: &Path) -> Orders {
        let store = SqliteStore::open(path).await.expect("open");
        Orders {
            rt: Runtime::builder().store(store).build().expect("runtime"),
            executions: AtomicU32::new(0),
        }
    }

    #[idempotent(key = "order_id", scope = "orders.create", runtime = &self.rt)]
    async fn create(&self, order_id: u64) -> Result<String, TestError> {
        self.executions.fetch_add(1, Ordering::SeqCst);
        Ok(format!("order {order_id} created"))
    }
}

#[tokio::test]
async fn a_restart_replays_instead_of_reexecuting() {
    let path = db_path("restart");
    let first = Orders::open(&path).await;
    assert_eq!(first.create(7).await, Ok("order 7 created".into()));
    assert_eq!(first.executions.load(Ordering::SeqCst), 1);
    drop(first);

    // A new process: new runtime, new pool, same file.
    let second = Orders::open(&path).await;
    assert_eq!(second.create(7).await, Ok("order 7 created".into()));
    assert_eq!(
        second.executions.load(Ordering::SeqCst),
        0,
        "replayed from the file"
    );
    assert_eq!(second.rt.stats().replays, 1);
}

const KEYS: u64 = 200;

/// The worker half of the cross-process test: runs only when the parent test starts this binary with
/// `SAMEKEY_WORKER_DB` set. Each execution inserts a row in an `effects` table of the same file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_process() {
    let Ok(path) = std::env::var("SAMEKEY_WORKER_DB") else {
        return;
    };
    struct Worker {
        rt: Runtime,
        store: SqliteStore,
    }
    impl Worker {
        #[idempotent(key = "key", scope = "race", runtime = &self.rt)]
        async fn effect(&self, key: u64) -> Result<u32, TestError> {
            // The effect takes a moment, so the other process meets the key while it is running.
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            sqlx::query("INSERT INTO effects (key, pid) VALUES (?1, ?2)")
                .bind(i64::try_from(key).unwrap_or(i64::MAX))
                .bind(i64::from(std::process::id()))
                .execute(self.store.pool())
                .await
                .map_err(|_| TestError::Refused)?;
            Ok(std::process::id())
        }
    }
    let store = SqliteStore::open(&path).await.expect("open");
    let worker = Worker {
        rt: Runtime::builder()
            .store(store.clone())
            .build()
            .expect("runtime"),
        store,
    };
    // Both workers start at the same instant, one walking the keys up, the other down.
    for key in support::race::worker_keys(KEYS).await {
        worker.effect(key).await.expect("call");
    }
}

#[tokio::test]
async fn two_processes_race_and_each_key_runs_once() {
    let path = db_path("race");
    let store = SqliteStore::open(&path).await.expect("open");
    sqlx::query("CREATE TABLE effects (key INTEGER NOT NULL, pid INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .expect("effects table");
    support::race::run_two_workers(
        "sqlite_durability::worker_process",
        &[("SAMEKEY_WORKER_DB", path.to_str().expect("UTF-8 path"))],
    );
    let rows: Vec<(i64, i64)> =
        sqlx::query_as("SELECT key, COUNT(*) FROM effects GROUP BY key ORDER BY key")
            .fetch_all(store.pool())
            .await
            .expect("effects");
    let pids: Vec<(i64,)> = sqlx::query_as("SELECT DISTINCT pid FROM effects")
        .fetch_all(store.pool())
        .await
        .expect("pids");
    support::race::assert_each_key_ran_once(&rows, pids.len(), KEYS);
}

/// Issue 38, defect 7: `SqliteStore::complete_in` counted the receipt's ttl from the attempt's start.
/// A 3-minute job with `ttl = "2m"` wrote a receipt already expired, and the next duplicate ran
/// the job again. The ttl counts from the write, as the call path's own write and PostgreSQL's and
/// MySQL's `complete_in` count it.
#[tokio::test]
async fn a_receipt_written_in_the_body_lives_its_ttl_from_the_write() {
    struct Jobs {
        rt: Runtime,
        store: SqliteStore,
        clock: support::TestClock,
        runs: AtomicU32,
    }
    impl Jobs {
        #[idempotent(key = "job", scope = "jobs.export", runtime = &self.rt, ttl = "2m")]
        async fn export(&self, job: u64) -> Result<u64, TestError> {
            self.runs.fetch_add(1, Ordering::SeqCst);
            // The export takes three minutes.
            self.clock.advance(std::time::Duration::from_secs(180));
            let mut tx = self.store.pool().begin().await.expect("begin");
            SqliteStore::complete_in(&mut tx, &samekey::current(), &job)
                .await
                .expect("receipt");
            tx.commit().await.expect("commit");
            Ok(job)
        }
    }
    let store = SqliteStore::open(db_path("ttl-from-write"))
        .await
        .expect("open");
    let clock = support::TestClock::default();
    let jobs = Jobs {
        rt: Runtime::builder()
            .store(store.clone())
            .clock(clock.clone())
            .build()
            .expect("runtime"),
        store,
        clock,
        runs: AtomicU32::new(0),
    };
    assert_eq!(jobs.export(9).await, Ok(9));
    jobs.clock.advance(std::time::Duration::from_secs(60));
    assert_eq!(
        jobs.export(9).await,
        Ok(9),
        "replayed a minute after the write"
    );
    assert_eq!(jobs.runs.load(Ordering::SeqCst), 1, "the job ran once");
    assert_eq!(jobs.rt.stats().replays, 1);
}

/// `complete_in` wrote `Some(NaN)` as `null`, and duplicates read the receipt back as `None`: a
/// reading answered wrong. It refuses a value JSON cannot carry — the caller's transaction writes no
/// receipt — and the call's own write refuses it too: duplicates are told the call took effect
/// (`NotReplayable`) and never run it again.
#[tokio::test]
async fn complete_in_refuses_a_value_json_would_read_back_as_another() {
    struct Gauges {
        rt: Runtime,
        store: SqliteStore,
        runs: AtomicU32,
    }
    impl Gauges {
        #[idempotent(key = "id", scope = "gauges.calibrate", runtime = &self.rt)]
        async fn calibrate(&self, id: u64) -> Result<Option<f64>, TestError> {
            self.runs.fetch_add(1, Ordering::SeqCst);
            let reading = Some(f64::NAN);
            let mut tx = self.store.pool().begin().await.expect("begin");
            let refused = SqliteStore::complete_in(&mut tx, &samekey::current(), &reading).await;
            let err = refused.expect_err("a NaN has no JSON form");
            assert!(err.to_string().contains("NaN"), "{err}");
            drop(tx); // rolled back: no receipt written in it
            Ok(reading)
        }
    }
    let store = SqliteStore::open(db_path("complete-in-nan"))
        .await
        .expect("open");
    let gauges = Gauges {
        rt: Runtime::builder()
            .store(store.clone())
            .build()
            .expect("runtime"),
        store,
        runs: AtomicU32::new(0),
    };
    let first = gauges
        .calibrate(3)
        .await
        .expect("the first caller gets its value");
    assert!(first.is_some_and(f64::is_nan));
    match gauges.calibrate(3).await {
        Err(TestError::Samekey(samekey::Error::NotReplayable { .. })) => {}
        other => panic!("a duplicate is told the call took effect, never Ok(None): {other:?}"),
    }
    assert_eq!(gauges.runs.load(Ordering::SeqCst), 1, "it ran once");
}
