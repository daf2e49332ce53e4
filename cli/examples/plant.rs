//! Plants a day of receipts in an SQLite or PostgreSQL store, in bulk, and writes the counterparty's
//! file of the same day: what the closing timings of `samekey ls`, `audit` and `reconcile` at 10⁶
//! receipts run on (BENCHMARKS.md, "The samekey command at 10⁶").
//!
//! ```text
//! cargo run --release -p samekey-cli --example plant -- sqlite:/tmp/day.db 1000000 /tmp/day.csv
//! cargo run --release -p samekey-cli --example plant -- "$SAMEKEY_PG_URL" 1000000 /tmp/day.csv
//! ```
//!
//! The day: receipts 1 ms apart, ending an hour ago, in 4 scopes (`scale.s0`…`scale.s3`); 95 %
//! `SUCCESS`, 5 % `FAILED`, one in 10 000 left `UNKNOWN`; one in 50 retried, with a journal of three
//! events (an attempt that timed out, a backoff, an attempt that succeeded). The counterparty's file
//! (CSV: call_id, status, amount) agrees on every call but the `UNKNOWN` ones, which it says
//! succeeded. A PostgreSQL store's earlier `scale.%` rows are removed first.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use samekey_runtime::journal::AttemptOutcome;
use samekey_runtime::{journal::Event, journal::EventKind, CallId};

fn call_id(day_start: u64, i: u64) -> String {
    format!("lst-{}-{i:016x}-n1", day_start + i)
}

/// The journal events of a retried call, as JSON with `CALLID` and `AT` to fill in.
fn templates() -> Vec<String> {
    let call: CallId = "lst-1-0000000000000000-n1".parse().expect("a callId");
    let what = [
        EventKind::Attempt {
            attempt: 1,
            started_ms: 0,
            outcome: AttemptOutcome::TimedOut,
            error: Some("gateway timeout".into()),
        },
        EventKind::Backoff {
            attempt: 1,
            delay_ms: 120,
        },
        EventKind::Attempt {
            attempt: 2,
            started_ms: 0,
            outcome: AttemptOutcome::Ok,
            error: None,
        },
    ];
    what.into_iter()
        .map(|what| {
            let event = Event {
                call_id: call.clone(),
                at_ms: 0,
                node: "n1".into(),
                what,
            };
            serde_json::to_string(&event)
                .expect("an event is JSON")
                .replace("lst-1-0000000000000000-n1", "CALLID")
                .replace("\"at_ms\":0", "\"at_ms\":AT")
                .replace("\"started_ms\":0", "\"started_ms\":AT")
        })
        .collect()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, count, remote] = args.as_slice() else {
        return Err("usage: plant STORE_URL RECEIPTS REMOTE_FILE.csv".into());
    };
    let count: u64 = count.parse()?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64;
    let day_start = now - 3_600_000 - count;
    let started = std::time::Instant::now();
    if let Some(path) = url.strip_prefix("sqlite:") {
        plant_sqlite(path, day_start, count).await?;
    } else {
        plant_postgres(url, day_start, count).await?;
    }
    let mut file = std::io::BufWriter::new(std::fs::File::create(remote)?);
    writeln!(file, "call_id,status,amount")?;
    for i in 0..count {
        let status = if i % 20 == 0 { "failed" } else { "succeeded" };
        writeln!(file, "{},{status},1", call_id(day_start, i))?;
    }
    file.flush()?;
    println!(
        "planted {count} receipts in {url} and their counterparty's file {remote} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn plant_sqlite(
    path: &str,
    day_start: u64,
    count: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    samekey_runtime::store::SqliteStore::open(path).await?;
    let options = path.parse::<samekey_runtime::sqlx::sqlite::SqliteConnectOptions>()?;
    let pool = samekey_runtime::sqlx::SqlitePool::connect_with(options).await?;
    samekey_runtime::sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < $1)
INSERT INTO samekey_receipts
    (key, scope, call_id, state, fence, lease_until, expires_at, fingerprint, outcome, created, updated)
SELECT randomblob(32), 'scale.s' || (i % 4), printf('lst-%d-%016x-n1', $2 + i, i),
    CASE WHEN i % 10000 = 1 THEN 'UNKNOWN' WHEN i % 20 = 0 THEN 'FAILED' ELSE 'SUCCESS' END, 1, NULL,
    CASE WHEN i % 10000 = 1 THEN NULL ELSE $2 + i + 259200000 END, NULL, x'31', $2 + i, $2 + i
FROM n",
    )
    .bind(count as i64)
    .bind(day_start as i64)
    .execute(&pool)
    .await?;
    for template in templates() {
        samekey_runtime::sqlx::query(
            "INSERT INTO samekey_journal (key, call_id, at, keep_until, event)
SELECT key, call_id, created, created + 259200000,
    replace(replace($1, 'CALLID', call_id), 'AT', created)
FROM samekey_receipts WHERE scope LIKE 'scale.%' AND created % 50 = 0 ORDER BY created",
        )
        .bind(template)
        .execute(&pool)
        .await?;
    }
    Ok(())
}

async fn plant_postgres(
    url: &str,
    day_start: u64,
    count: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    samekey_runtime::store::PgStore::connect(url).await?;
    let pool = samekey_runtime::sqlx::PgPool::connect(url).await?;
    // The times' column type: BIGINT Unix ms, or timestamptz.
    let kind: String = samekey_runtime::sqlx::query_scalar(
        "SELECT data_type FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = 'samekey_receipts' AND column_name = 'created'",
    )
    .fetch_one(&pool)
    .await?;
    let t = |ms: &str| {
        if kind == "bigint" {
            ms.to_owned()
        } else {
            format!("(TIMESTAMPTZ 'epoch' + ({ms}) * INTERVAL '1 millisecond')")
        }
    };
    samekey_runtime::sqlx::query("DELETE FROM samekey_journal WHERE call_id LIKE 'lst-%'")
        .execute(&pool)
        .await?;
    samekey_runtime::sqlx::query("DELETE FROM samekey_receipts WHERE scope LIKE 'scale.%'")
        .execute(&pool)
        .await?;
    let receipts = format!(
        "INSERT INTO samekey_receipts
    (key, scope, call_id, state, fence, lease_until, expires_at, fingerprint, outcome, created, updated)
SELECT sha256(('scale.' || $2 || '.' || i)::bytea), 'scale.s' || (i % 4),
    'lst-' || ($2 + i) || '-' || lpad(to_hex(i), 16, '0') || '-n1',
    CASE WHEN i % 10000 = 1 THEN 'UNKNOWN' WHEN i % 20 = 0 THEN 'FAILED' ELSE 'SUCCESS' END, 1, NULL,
    CASE WHEN i % 10000 = 1 THEN NULL ELSE {} END, NULL, '\\x31', {}, {}
FROM generate_series(0, $1 - 1) AS i",
        t("$2 + i + 259200000"),
        t("$2 + i"),
        t("$2 + i")
    );
    samekey_runtime::sqlx::query(samekey_runtime::sqlx::AssertSqlSafe(receipts))
        .bind(count as i64)
        .bind(day_start as i64)
        .execute(&pool)
        .await?;
    let created_ms = if kind == "bigint" {
        "created".to_owned()
    } else {
        "(extract(epoch FROM created) * 1000)::BIGINT".to_owned()
    };
    for template in templates() {
        let journal = format!(
            "INSERT INTO samekey_journal (key, call_id, at, keep_until, event)
SELECT key, call_id, created, created + {}, replace(replace($1, 'CALLID', call_id), 'AT', {created_ms}::TEXT)::JSONB
FROM samekey_receipts WHERE scope LIKE 'scale.%' AND {created_ms} % 50 = 0 ORDER BY created",
            if kind == "bigint" { "259200000" } else { "INTERVAL '3 days'" }
        );
        samekey_runtime::sqlx::query(samekey_runtime::sqlx::AssertSqlSafe(journal))
            .bind(template)
            .execute(&pool)
            .await?;
    }
    samekey_runtime::sqlx::query("ANALYZE samekey_receipts")
        .execute(&pool)
        .await?;
    samekey_runtime::sqlx::query("ANALYZE samekey_journal")
        .execute(&pool)
        .await?;
    Ok(())
}
