//! The migration of a PostgreSQL store from an earlier release's schema, whose times were `BIGINT` Unix
//! ms, to `timestamptz`: nothing is lost (every time reads back through the store to the millisecond),
//! and running the migration again changes nothing. Each test works in a PostgreSQL schema of its own
//! (`search_path`), dropped at its end. Needs a server: `SAMEKEY_PG_URL` (see `scripts/services`);
//! without it every test prints that it was skipped.
//!
//! (Was `runtime/tests/postgres_migration.rs`: it needs nothing but `samekey_runtime`, a dependency of
//! this package, and runs here beside the other PostgreSQL cases of the stores.)
#![cfg(feature = "postgres")]

use std::str::FromStr;
use std::sync::Arc;

use samekey_runtime::journal::{AttemptOutcome, Event, EventKind};
use samekey_runtime::sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use samekey_runtime::sqlx::{self, Row};
use samekey_runtime::store::{Claim, Claimed, Completion, PgStore, ReceiptQuery};
use samekey_runtime::{
    compensation::CompensationEntry, compensation::CompensationState, key::Fingerprint,
    receipt::Fence, CallId, Key, Receipt, ReceiptState, Store, TraceId,
};

/// The schema of the release before times became `timestamptz`, verbatim (`PgStore`'s `SCHEMA` then).
const OLD_SCHEMA: &str = "
CREATE SEQUENCE IF NOT EXISTS samekey_fence;
-- The time every instance's leases and expiries are judged by: the server's clock, never a caller's
-- (nodes disagree about time), read once per statement (a lease and the time it was granted agree).
-- The caller's time is taken, and ignored, so that the statements are the same as on SQLite, where
-- the caller's time is the judge.
CREATE OR REPLACE FUNCTION samekey_now(caller BIGINT) RETURNS BIGINT
    LANGUAGE sql STABLE AS 'SELECT (extract(epoch FROM statement_timestamp()) * 1000)::BIGINT';
CREATE TABLE IF NOT EXISTS samekey_receipts (
    key         BYTEA PRIMARY KEY,          -- SHA-256 of scope and key parts: the unique index
    scope       TEXT NOT NULL,
    call_id     TEXT NOT NULL,
    state       TEXT NOT NULL,              -- RECEIVED PROCESSING UNKNOWN SUCCESS FAILED, or RELEASED
    fence       BIGINT NOT NULL,
    lease_until BIGINT,
    expires_at  BIGINT,
    fingerprint BYTEA,
    outcome     BYTEA,
    created     BIGINT NOT NULL,
    updated     BIGINT NOT NULL,
    waited      BOOLEAN NOT NULL DEFAULT false  -- a duplicate listens for the record's next change
);
ALTER TABLE samekey_receipts ADD COLUMN IF NOT EXISTS waited BOOLEAN NOT NULL DEFAULT false;
-- A waited-for record's change (an outcome, UNKNOWN, a release, a take-over) notifies its waiters, on
-- the channel samekey_ + the first 32 hex digits of its key, when the change commits. Records nobody
-- waits for notify nobody: the trigger's condition is all they cost.
CREATE OR REPLACE FUNCTION samekey_settled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('samekey_' || substr(encode(NEW.key, 'hex'), 1, 32), NEW.state);
    RETURN NULL;
END $$;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'samekey_settled') THEN
        CREATE TRIGGER samekey_settled AFTER UPDATE ON samekey_receipts FOR EACH ROW
            WHEN (OLD.waited AND (OLD.state IS DISTINCT FROM NEW.state OR OLD.fence <> NEW.fence))
            EXECUTE FUNCTION samekey_settled();
    END IF;
END $$;
CREATE INDEX IF NOT EXISTS samekey_receipts_call_id ON samekey_receipts (call_id);
CREATE INDEX IF NOT EXISTS samekey_receipts_expires_at ON samekey_receipts (expires_at)
    WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS samekey_compensation (
    call_id     TEXT PRIMARY KEY,
    key         BYTEA NOT NULL,
    scope       TEXT NOT NULL,
    reason      TEXT NOT NULL,
    round       BIGINT NOT NULL,
    next_at     BIGINT NOT NULL,
    state       TEXT NOT NULL,              -- PENDING TAKEN MANUAL
    lease_until BIGINT,
    enqueued    BIGINT NOT NULL,
    taker       BIGINT NOT NULL DEFAULT 0,  -- the worker fence of the latest take
    attempts    BIGINT NOT NULL DEFAULT 0,  -- attempts the call made before it was queued
    last_error  TEXT,                       -- how its last attempt ended: timed_out, unknown, …
    inputs      BYTEA                       -- its inputs (JSON), when its function keeps them
);
ALTER TABLE samekey_compensation ADD COLUMN IF NOT EXISTS taker BIGINT NOT NULL DEFAULT 0;
ALTER TABLE samekey_compensation ADD COLUMN IF NOT EXISTS attempts BIGINT NOT NULL DEFAULT 0;
ALTER TABLE samekey_compensation ADD COLUMN IF NOT EXISTS last_error TEXT;
ALTER TABLE samekey_compensation ADD COLUMN IF NOT EXISTS inputs BYTEA;
CREATE INDEX IF NOT EXISTS samekey_compensation_due ON samekey_compensation (next_at)
    WHERE state <> 'MANUAL';
CREATE TABLE IF NOT EXISTS samekey_journal (
    seq         BIGSERIAL PRIMARY KEY,
    key         BYTEA NOT NULL,             -- the key's digest (samekey_receipts.key)
    call_id     TEXT NOT NULL,
    at          BIGINT NOT NULL,            -- Unix ms, by the writing node's clock
    keep_until  BIGINT NOT NULL,            -- kept until then at least, and while the key's record lives
    event       JSONB NOT NULL              -- call_id, at_ms, node, event and its fields
);
CREATE INDEX IF NOT EXISTS samekey_journal_key ON samekey_journal (key, seq);
CREATE INDEX IF NOT EXISTS samekey_journal_call_id ON samekey_journal (call_id, seq);
CREATE INDEX IF NOT EXISTS samekey_journal_keep ON samekey_journal (keep_until);
";

/// The indexes that release built after its schema (its `PgStore::LATER_INDEXES`), verbatim.
const OLD_LATER_INDEXES: [&str; 3] = [
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS samekey_receipts_orphans
    ON samekey_receipts (lease_until) WHERE state = 'PROCESSING'",
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS samekey_receipts_created
    ON samekey_receipts (created, key)",
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS samekey_receipts_scope_created
    ON samekey_receipts (scope, created, key)",
];

/// The time columns, by table: each is a `timestamptz` once migrated.
const TIME_COLUMNS: [(&str, &str); 9] = [
    ("samekey_receipts", "lease_until"),
    ("samekey_receipts", "expires_at"),
    ("samekey_receipts", "created"),
    ("samekey_receipts", "updated"),
    ("samekey_compensation", "next_at"),
    ("samekey_compensation", "lease_until"),
    ("samekey_compensation", "enqueued"),
    ("samekey_journal", "at"),
    ("samekey_journal", "keep_until"),
];

/// Known times (Unix ms), none a whole second, one at the epoch's first milliseconds.
const C1: u64 = 1_796_029_200_123;
const U1: u64 = 1_796_029_200_456;
const L2: u64 = 1_796_029_290_789;
const C3: u64 = 1_796_029_201_001;
const U3: u64 = 1_796_029_205_999;
const EXPIRES: u64 = 4_102_444_800_123;
const KEEP: u64 = 4_102_444_800_999;
const NEXT: u64 = 1_796_029_260_321;
const TAKEN_UNTIL: u64 = 1_796_029_230_555;
const ENQUEUED: u64 = 1_796_029_205_999;

/// A PostgreSQL schema of the test's own, the search path of every connection of `pool`.
struct Isolated {
    admin: PgPool,
    schema: String,
    pool: PgPool,
}

impl Isolated {
    async fn new(what: &str) -> Option<Isolated> {
        let Ok(url) = std::env::var("SAMEKEY_PG_URL") else {
            samekey_runtime::conformance::skipped(
                "set SAMEKEY_PG_URL (scripts/services start) to run the PostgreSQL migration tests",
            );
            return None;
        };
        let schema = format!("samekey_{what}_{:x}", TraceId::new().as_u128() as u64);
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .expect("connect to SAMEKEY_PG_URL");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&admin)
            .await
            .expect("create the test's schema");
        let options = PgConnectOptions::from_str(&url)
            .expect("SAMEKEY_PG_URL")
            .options([("search_path", schema.as_str())]);
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .expect("connect in the test's schema");
        Some(Isolated {
            admin,
            schema,
            pool,
        })
    }

    /// The data type of each time column, as `information_schema` names it.
    async fn time_types(&self) -> Vec<String> {
        let mut types = Vec::new();
        for (table, column) in TIME_COLUMNS {
            let kind: String = sqlx::query_scalar(
                "SELECT data_type::text FROM information_schema.columns
                WHERE table_schema = $1 AND table_name = $2 AND column_name = $3",
            )
            .bind(&self.schema)
            .bind(table)
            .bind(column)
            .fetch_one(&self.admin)
            .await
            .unwrap_or_else(|e| panic!("{table}.{column}: {e}"));
            types.push(kind);
        }
        types
    }

    /// Every row of the three tables as text (times as stored), and the tables' files: what a rewrite
    /// or a changed value would show.
    async fn snapshot(&self) -> (Vec<String>, Vec<i64>) {
        let rows: Vec<String> = sqlx::query_scalar(
            "SELECT t::text FROM (
                SELECT 'r' AS tbl, row_to_json(r)::text AS t, 1 AS o FROM samekey_receipts r
                UNION ALL SELECT 'c', row_to_json(c)::text, 2 FROM samekey_compensation c
                UNION ALL SELECT 'j', row_to_json(j)::text, 3 FROM samekey_journal j) AS x
            ORDER BY o, t",
        )
        .fetch_all(&self.pool)
        .await
        .expect("read the tables");
        let files: Vec<i64> = sqlx::query_scalar(
            "SELECT pg_relation_filenode(to_regclass(t))::bigint
            FROM unnest(ARRAY['samekey_receipts', 'samekey_compensation', 'samekey_journal']) AS t",
        )
        .fetch_all(&self.pool)
        .await
        .expect("the tables' files");
        (rows, files)
    }

    /// What `work` answers within 2 s while the migration lock is held by another session, or
    /// `None` when it waited longer.
    async fn while_migration_locked<T>(
        &self,
        work: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        let mut holder = self.admin.acquire().await.expect("a connection");
        sqlx::query("SELECT pg_advisory_lock(hashtext('samekey.migrate'))")
            .execute(&mut *holder)
            .await
            .expect("take the migration lock");
        let answer = tokio::time::timeout(std::time::Duration::from_secs(2), work)
            .await
            .ok();
        sqlx::query("SELECT pg_advisory_unlock(hashtext('samekey.migrate'))")
            .execute(&mut *holder)
            .await
            .expect("give the migration lock back");
        answer
    }

    async fn drop(self) {
        self.pool.close().await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA {} CASCADE",
            self.schema
        )))
        .execute(&self.admin)
        .await
        .expect("drop the test's schema");
    }
}

fn call_id(n: u64) -> CallId {
    format!("mig-{n}-{:016x}-n1", TraceId::new().as_u128() as u64)
        .parse()
        .expect("a callId")
}

fn key(n: u64) -> Key {
    Key::build("migration.orders", &n)
}

/// A row in an earlier release's `samekey_receipts`.
async fn old_receipt(pool: &PgPool, r: &Receipt) {
    let int = |v: u64| i64::try_from(v).expect("fits");
    sqlx::query(
        "INSERT INTO samekey_receipts
            (key, scope, call_id, state, fence, lease_until, expires_at, fingerprint, outcome,
             created, updated)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(r.key.digest().as_slice())
    .bind(r.key.scope())
    .bind(r.call_id.to_string())
    .bind(r.state.as_str())
    .bind(int(r.fence.0))
    .bind(r.lease_until_ms.map(int))
    .bind(r.expires_at_ms.map(int))
    .bind(r.fingerprint.map(|f| f.0.to_vec()))
    .bind(r.outcome.as_deref())
    .bind(int(r.created_ms))
    .bind(int(r.updated_ms))
    .execute(pool)
    .await
    .expect("an old receipt row");
}

/// The receipts written in the old schema: a finished one (the epoch's first milliseconds), a finished
/// and a processing one created in the same millisecond, an unknown one.
fn receipts() -> Vec<Receipt> {
    let receipt = |n: u64, state, fence, lease, expires, created, updated| Receipt {
        key: key(n),
        call_id: call_id(n),
        state,
        fence: Fence(fence),
        lease_until_ms: lease,
        expires_at_ms: expires,
        fingerprint: Some(Fingerprint([n as u8; 32])),
        outcome: (state == ReceiptState::Success).then(|| Arc::from(&b"42"[..])),
        created_ms: created,
        updated_ms: updated,
    };
    vec![
        receipt(1, ReceiptState::Success, 11, None, Some(EXPIRES), C1, U1),
        receipt(2, ReceiptState::Processing, 12, Some(L2), None, C1, C1),
        receipt(3, ReceiptState::Unknown, 13, None, None, C3, U3),
        receipt(5, ReceiptState::Success, 15, None, Some(EXPIRES), 1, 2),
    ]
}

#[tokio::test]
async fn bigint_times_become_timestamptz_to_the_millisecond() {
    let Some(db) = Isolated::new("bigint").await else {
        return;
    };
    sqlx::raw_sql(OLD_SCHEMA)
        .execute(&db.pool)
        .await
        .expect("the old schema");
    for index in OLD_LATER_INDEXES {
        sqlx::raw_sql(index)
            .execute(&db.pool)
            .await
            .expect("the old later indexes");
    }
    assert_eq!(db.time_types().await, vec!["bigint"; 9]);

    let written = receipts();
    for r in &written {
        old_receipt(&db.pool, r).await;
    }
    let unknown = &written[2];
    let taken = CompensationEntry {
        call_id: unknown.call_id.clone(),
        key: unknown.key.clone(),
        reason: "the gateway did not answer".into(),
        round: 2,
        next_at_ms: NEXT,
        state: CompensationState::Taken {
            lease_until_ms: TAKEN_UNTIL,
        },
        enqueued_ms: ENQUEUED,
        fence: Fence(4),
        attempts: 3,
        last_error: Some(AttemptOutcome::TimedOut),
        encoded_inputs: Some(Arc::from(&br#"{"n":3}"#[..])),
    };
    let pending = CompensationEntry {
        call_id: call_id(6),
        key: key(6),
        reason: "an orphan".into(),
        round: 0,
        next_at_ms: NEXT + 1,
        state: CompensationState::Pending,
        enqueued_ms: ENQUEUED + 1,
        fence: Fence(0),
        attempts: 0,
        last_error: None,
        encoded_inputs: None,
    };
    for (entry, state, lease, last_error) in [
        (&taken, "TAKEN", Some(TAKEN_UNTIL as i64), Some("timed_out")),
        (&pending, "PENDING", None, None),
    ] {
        sqlx::query(
            "INSERT INTO samekey_compensation (call_id, key, scope, reason, round, next_at, state,
                lease_until, enqueued, taker, attempts, last_error, inputs)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        )
        .bind(entry.call_id.to_string())
        .bind(entry.key.digest().as_slice())
        .bind(entry.key.scope())
        .bind(&entry.reason)
        .bind(i64::from(entry.round))
        .bind(entry.next_at_ms as i64)
        .bind(state)
        .bind(lease)
        .bind(entry.enqueued_ms as i64)
        .bind(entry.fence.0 as i64)
        .bind(i64::from(entry.attempts))
        .bind(last_error)
        .bind(entry.encoded_inputs.as_deref())
        .execute(&db.pool)
        .await
        .expect("an old compensation row");
    }
    let finished = &written[0];
    let events = vec![
        Event {
            call_id: finished.call_id.clone(),
            at_ms: C1,
            node: "n1".into(),
            what: EventKind::Claimed { fence: 11 },
        },
        Event {
            call_id: finished.call_id.clone(),
            at_ms: U1,
            node: "n1".into(),
            what: EventKind::Recorded {
                state: ReceiptState::Success,
                by: "call".into(),
            },
        },
    ];
    for event in &events {
        sqlx::query(
            "INSERT INTO samekey_journal (key, call_id, at, keep_until, event)
            VALUES ($1, $2, $3, $4, $5::jsonb)",
        )
        .bind(finished.key.digest().as_slice())
        .bind(event.call_id.to_string())
        .bind(event.at_ms as i64)
        .bind(KEEP as i64)
        .bind(serde_json::to_string(event).expect("an event"))
        .execute(&db.pool)
        .await
        .expect("an old journal row");
    }

    // The old schema is not taken for migrated: while another instance holds the migration lock, a
    // migration waits for it.
    let store = PgStore::from_pool(db.pool.clone());
    assert!(
        db.while_migration_locked(store.migrate()).await.is_none(),
        "an old schema is migrated, not taken as it is"
    );

    // The migration a service of this release runs when it starts.
    store.migrate().await.expect("migrate");
    assert_eq!(db.time_types().await, vec!["timestamp with time zone"; 9]);
    // Now it is migrated: a starting instance takes no lock, and does not wait for one.
    db.while_migration_locked(store.migrate())
        .await
        .expect("migrated: no wait for the lock")
        .expect("migrate");
    let in_place: bool = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM pg_index WHERE indisvalid AND indexrelid IN (
                to_regclass('samekey_receipts_created'), to_regclass('samekey_receipts_scope_created'),
                to_regclass('samekey_receipts_orphans'), to_regclass('samekey_receipts_expires_at'),
                to_regclass('samekey_compensation_due'), to_regclass('samekey_journal_keep'))) = 6
            AND EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'samekey_settled'
                AND tgrelid = to_regclass('samekey_receipts'))",
    )
    .fetch_one(&db.pool)
    .await
    .expect("ask");
    assert!(
        in_place,
        "the indexes rebuilt and valid, the trigger on the table"
    );

    // Every time reads back through the store exactly as it was written.
    let now = C1;
    for r in &written {
        assert_eq!(store.get(&r.key, now).await.expect("get").as_ref(), Some(r));
        assert_eq!(
            store
                .get_by_call_id(&r.call_id)
                .await
                .expect("by callId")
                .as_ref(),
            Some(r)
        );
    }
    let mut in_order = written.clone();
    in_order.sort_by_key(|r| (r.created_ms, *r.key.digest()));
    let all = ReceiptQuery::created_between(0, C3 + 1).scope("migration.orders");
    let page = store.list_receipts(&all, now).await.expect("list");
    assert_eq!(page.receipts, in_order);
    assert_eq!(page.next, None);
    // Page by page, each cursor a converted (created, key).
    let mut paged = Vec::new();
    let mut query = all.clone().limit(1);
    loop {
        let page = store.list_receipts(&query, now).await.expect("a page");
        paged.extend(page.receipts);
        match page.next {
            Some(cursor) => query = query.after(cursor),
            None => break,
        }
    }
    assert_eq!(paged, in_order);
    // The range's bounds, to the millisecond: `until` excludes what was created at it.
    let before_c3 = ReceiptQuery::created_between(C1, C3).scope("migration.orders");
    let page = store.list_receipts(&before_c3, now).await.expect("list");
    assert_eq!(
        page.receipts
            .iter()
            .map(|r| r.created_ms)
            .collect::<Vec<_>>(),
        vec![C1, C1]
    );
    // The processing one is past its lease, by the server's clock.
    let orphans = store.list_orphans(now, 10).await.expect("orphans");
    assert_eq!(orphans, vec![written[1].clone()]);

    assert_eq!(
        store.list_compensations().await.expect("compensations"),
        vec![taken.clone(), pending.clone()]
    );
    assert_eq!(
        store.journal(&finished.key, now).await.expect("journal"),
        events
    );
    assert_eq!(
        store
            .journal_of_call(&finished.call_id, now)
            .await
            .expect("journal of the call"),
        events
    );
    let journal_times: Vec<(i64, i64)> = sqlx::query(
        "SELECT samekey_ms(at) AS at, samekey_ms(keep_until) AS keep FROM samekey_journal ORDER BY seq",
    )
    .fetch_all(&db.pool)
    .await
    .expect("journal times")
    .iter()
    .map(|row| (row.get("at"), row.get("keep")))
    .collect();
    assert_eq!(
        journal_times,
        vec![(C1 as i64, KEEP as i64), (U1 as i64, KEEP as i64)]
    );
    // As psql shows them: the instant, whatever the session's time zone.
    let shown: String = sqlx::query_scalar(
        "SELECT to_char(created AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS')
        FROM samekey_receipts WHERE key = $1",
    )
    .bind(finished.key.digest().as_slice())
    .fetch_one(&db.pool)
    .await
    .expect("created");
    assert_eq!(shown, "2026-11-30 09:00:00.123");

    // A second migration changes nothing: not a value, not a table's file. Dropping an index makes
    // the schema run again in full (its conversion finds nothing left to convert).
    let before = db.snapshot().await;
    store.migrate().await.expect("migrate again");
    assert_eq!(db.snapshot().await, before);
    sqlx::raw_sql("DROP INDEX CONCURRENTLY IF EXISTS samekey_receipts_scope_created")
        .execute(&db.pool)
        .await
        .expect("drop an index");
    store.migrate().await.expect("migrate once more, in full");
    assert_eq!(db.snapshot().await, before);
    assert_eq!(db.time_types().await, vec!["timestamp with time zone"; 9]);

    // Everything else in place but one column still BIGINT: not migrated, and that column converted.
    sqlx::raw_sql(
        "ALTER TABLE samekey_receipts ALTER COLUMN updated TYPE bigint USING samekey_ms(updated)",
    )
    .execute(&db.pool)
    .await
    .expect("a column back to BIGINT");
    store.migrate().await.expect("migrate the column");
    assert_eq!(db.time_types().await, vec!["timestamp with time zone"; 9]);
    for r in &written {
        assert_eq!(store.get(&r.key, now).await.expect("get").as_ref(), Some(r));
    }

    db.drop().await;
}

#[tokio::test]
async fn a_fresh_database_keeps_timestamptz_and_whole_milliseconds() {
    let Some(db) = Isolated::new("fresh").await else {
        return;
    };
    let store = PgStore::from_pool(db.pool.clone());
    store.migrate().await.expect("migrate");
    assert_eq!(db.time_types().await, vec!["timestamp with time zone"; 9]);

    // Times written by the server's clock: whole milliseconds, read back as written.
    let k = key(7);
    let claim = Claim {
        key: k.clone(),
        call_id: call_id(7),
        fingerprint: None,
        lease_ms: 30_000,
        now_ms: 1,
    };
    let Claimed::Acquired(fence) = store.claim(claim).await.expect("claim") else {
        panic!("a fresh key is taken");
    };
    let processing = store.get(&k, 1).await.expect("get").expect("the record");
    assert_eq!(
        processing.lease_until_ms,
        Some(processing.updated_ms + 30_000)
    );
    let server_now = store.now_ms(1).await.expect("the store's time");
    assert!(
        processing.created_ms <= server_now && server_now - processing.created_ms < 60_000,
        "created {} by the server's clock, now {server_now}",
        processing.created_ms
    );
    store
        .complete(
            &k,
            fence,
            Completion {
                state: ReceiptState::Success,
                outcome: Some(Arc::from(&b"7"[..])),
                ttl_ms: 86_400_000,
            },
            1,
        )
        .await
        .expect("complete");
    let done = store.get(&k, 1).await.expect("get").expect("the record");
    assert_eq!(done.expires_at_ms, Some(done.updated_ms + 86_400_000));
    let (created, whole): (i64, bool) = sqlx::query_as(
        "SELECT samekey_ms(created), extract(microseconds FROM created)::bigint % 1000 = 0
        FROM samekey_receipts WHERE key = $1",
    )
    .bind(k.digest().as_slice())
    .fetch_one(&db.pool)
    .await
    .expect("created");
    assert_eq!(created as u64, done.created_ms);
    assert!(whole, "a whole millisecond");

    // Times a caller hands over (a queued entry's, an event's) are kept exactly; a queued entry is
    // due by the server's clock (issue 38), a whole millisecond too.
    let entry = CompensationEntry::new(call_id(8), key(8), "queued", C1);
    store
        .enqueue_compensation(entry.clone())
        .await
        .expect("enqueue");
    let listed = store.list_compensations().await.expect("list");
    let server_now = store.now_ms(0).await.expect("now");
    assert!(
        listed[0].next_at_ms.abs_diff(server_now) < 60_000,
        "due at the server's now, not the caller's {C1}: {listed:?}"
    );
    assert_eq!(
        listed,
        vec![CompensationEntry {
            next_at_ms: listed[0].next_at_ms,
            ..entry
        }]
    );
    let event = Event {
        call_id: done.call_id.clone(),
        at_ms: U1,
        node: "n1".into(),
        what: EventKind::FencedOut,
    };
    store
        .append_journal(&k, std::slice::from_ref(&event), 60_000, 1)
        .await
        .expect("append");
    assert_eq!(store.journal(&k, 1).await.expect("journal"), vec![event]);
    let at: i64 = sqlx::query_scalar("SELECT samekey_ms(at) FROM samekey_journal")
        .fetch_one(&db.pool)
        .await
        .expect("at");
    assert_eq!(at as u64, U1);

    db.drop().await;
}
