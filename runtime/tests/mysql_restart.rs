//! MySQL or MariaDB killed (`kill -9`) and restarted in the middle of a run: calls fail closed while it
//! is down, no completed receipt is lost, and no key runs twice (as `tests/postgres_restart.rs` does
//! on PostgreSQL). Needs the server that `scripts/services start` runs (`SAMEKEY_MYSQL_URL` and
//! `SAMEKEY_SERVICES_DIR` set): it restarts it. A test binary of its own, so that no other test is
//! running against the server at that moment.
#![cfg(feature = "mysql")]

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use samekey_runtime::at_most_once::AtMostOnce;
use samekey_runtime::store::MySqlStore;
use samekey_runtime::{Classify, Error, ErrorClass, Runtime};

#[derive(Debug, PartialEq, thiserror::Error)]
enum RunError {
    #[error(transparent)]
    Samekey(#[from] Error),
}

impl Classify for RunError {
    fn classify(&self) -> ErrorClass {
        match self {
            RunError::Samekey(e) => e.classify(),
        }
    }
}

static RUN: AtMostOnce = AtMostOnce::new("mysql_restart.run");

type Effects = Arc<Mutex<HashMap<u64, u32>>>;

/// The effect of key `(tag, id)`, counted each time it runs.
async fn run(rt: &Runtime, effects: &Effects, tag: &str, id: u64) -> Result<u64, RunError> {
    RUN.key(tag)
        .part(&id)
        .runtime(rt)
        .run(|| async move {
            *effects
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(id)
                .or_default() += 1;
            Ok(id * 10)
        })
        .await
}

fn effects_of(effects: &Effects, id: u64) -> u32 {
    effects
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&id)
        .copied()
        .unwrap_or(0)
}

const KEYS: u64 = 150;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_loses_no_receipt_and_runs_nothing_twice() {
    let (Ok(url), Ok(_)) = (
        std::env::var("SAMEKEY_MYSQL_URL"),
        std::env::var("SAMEKEY_SERVICES_DIR"),
    ) else {
        samekey_runtime::conformance::skipped(
            "start the servers with `eval \"$(scripts/services start)\"` to run the MySQL restart test",
        );
        return;
    };
    let store = MySqlStore::connect(&url).await.expect("connect");
    let rt = Runtime::builder()
        .store(store)
        // A claim the server wrote before it went down, unanswered, is given back if the server
        // answers again within 7/8 of this lease: a restart with crash recovery takes far less.
        .lease(Duration::from_secs(10))
        .busy_wait(Duration::from_secs(12))
        .build()
        .unwrap();
    let effects: Effects = Arc::default();
    let tag = format!("{:x}", samekey_runtime::TraceId::new().as_u128());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/services");

    let mut first = Vec::new();
    let mut restart = None;
    let mut restarted_by = None;
    for id in 0..KEYS {
        if id == KEYS / 3 {
            restart = Some(tokio::task::spawn_blocking(move || {
                Command::new(script).arg("restart-mariadb").status()
            }));
        }
        first.push(run(&rt, &effects, &tag, id).await);
        if restarted_by.is_none() && restart.as_ref().is_some_and(|r| r.is_finished()) {
            restarted_by = Some(id);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let restarted_by = restarted_by.expect("the restart finished before the last call");
    println!(
        "the server restarted between calls {} and {restarted_by}",
        KEYS / 3
    );
    let restarted = restart.expect("restart started").await.expect("join");
    assert!(
        restarted.expect("scripts/services").success(),
        "restart-mariadb failed"
    );
    let failed_closed = first
        .iter()
        .filter(|o| matches!(o, Err(RunError::Samekey(Error::Store(_)))))
        .count();
    println!("{failed_closed} of {KEYS} calls failed closed while the server restarted");

    let mut replayed = 0;
    for id in 0..KEYS {
        let second = run(&rt, &effects, &tag, id).await;
        let ran = effects_of(&effects, id);
        assert!(ran <= 1, "key {id} ran {ran} times");
        match &first[id as usize] {
            Ok(v) => {
                assert_eq!(ran, 1);
                // Its receipt was written (a replay), or its completion fell into the outage: then the
                // call is left UNKNOWN, never run again.
                match second {
                    Ok(again) => {
                        assert_eq!(again, *v);
                        replayed += 1;
                    }
                    Err(RunError::Samekey(Error::Unknown { .. })) => {}
                    other => panic!("key {id}: {other:?} after a success"),
                }
            }
            Err(RunError::Samekey(Error::Store(_))) => {
                // Failed closed: nothing ran then (a claim the server wrote before it went down was
                // given back once it answered again); now it runs, once.
                assert_eq!(second, Ok(id * 10), "key {id}");
                assert_eq!(effects_of(&effects, id), 1);
            }
            other => panic!("key {id}: unexpected first outcome {other:?}"),
        }
    }
    let succeeded_first = first.iter().filter(|o| o.is_ok()).count();
    println!("{replayed} of {succeeded_first} first successes replayed after the restart");
    assert!(
        replayed + 2 >= succeeded_first,
        "completed receipts were lost"
    );
}
