//! Two OS processes racing on the same keys: the test binary starts itself twice as workers (running
//! only its worker test), one walking the keys up and one down, so that they meet in the middle.

use std::process::Command;
use std::time::Duration;

const START: &str = "SAMEKEY_WORKER_START";
const DOWN: &str = "SAMEKEY_WORKER_DOWN";

fn unix_ms() -> u64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970");
    u64::try_from(since_epoch.as_millis()).expect("milliseconds fit a u64")
}

/// Runs `worker_test` of this test binary in two processes with `env` set, starting both at the same
/// instant, and waits for them to succeed.
pub fn run_two_workers(worker_test: &str, env: &[(&str, &str)]) {
    let exe = std::env::current_exe().expect("test binary");
    let start = (unix_ms() + 1_500).to_string();
    let spawn = |down: bool| {
        let mut command = Command::new(&exe);
        command
            .args(["--exact", worker_test, "--nocapture"])
            .env(START, &start)
            .envs(env.iter().copied());
        if down {
            command.env(DOWN, "1");
        }
        command.spawn().expect("worker process")
    };
    let (mut up, mut down) = (spawn(false), spawn(true));
    assert!(
        up.wait().expect("worker").success(),
        "the first worker failed"
    );
    assert!(
        down.wait().expect("worker").success(),
        "the second worker failed"
    );
}

/// In a worker: waits for the common start, then gives the keys `0..keys` in this worker's order.
pub async fn worker_keys(keys: u64) -> impl Iterator<Item = u64> {
    let start: u64 = std::env::var(START)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(start.saturating_sub(unix_ms()))).await;
    let down = std::env::var(DOWN).is_ok();
    (0..keys).map(move |n| if down { keys - 1 - n } else { n })
}

/// Checks what the workers did: `rows` are `(key, executions)`, `processes` how many processes ran
/// at least one key.
pub fn assert_each_key_ran_once(rows: &[(i64, i64)], processes: usize, keys: u64) {
    assert_eq!(rows.len() as u64, keys, "every key ran");
    let twice: Vec<_> = rows.iter().filter(|(_, n)| *n != 1).collect();
    assert!(twice.is_empty(), "keys that ran more than once: {twice:?}");
    println!("{} keys, executed by {processes} processes", rows.len());
    assert_eq!(processes, 2, "both processes ran some keys: they raced");
}
