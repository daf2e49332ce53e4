
CREATE SEQUENCE IF NOT EXISTS samekey_fence;
-- The time every instance's leases and expiries are judged by: the server's clock, never a caller's
-- (nodes disagree about time), read once per statement (a lease and the time it was granted agree),
-- in Unix ms. The caller's time is taken, and ignored, so that the statements are the same as on
-- SQLite, where the caller's time is the judge.
CREATE OR REPLACE FUNCTION samekey_now(caller BIGINT) RETURNS BIGINT
    LANGUAGE sql STABLE AS 'SELECT (extract(epoch FROM statement_timestamp()) * 1000)::BIGINT';
-- Times are stored as timestamptz, and handed to samekey as Unix ms: samekey_ts turns a time in ms
-- into one to store or to compare a column with, samekey_ms reads a column back as ms. A stored time is
-- a whole millisecond, which a timestamptz (microseconds) holds exactly: what goes in as ms comes back
-- the same. Both are immutable (the session's TimeZone changes nothing), so the planner inlines them
-- and an index on a column serves a comparison with a converted parameter.
CREATE OR REPLACE FUNCTION samekey_ts(ms BIGINT) RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$SELECT (TIMESTAMP 'epoch' + ms * INTERVAL '1 millisecond') AT TIME ZONE 'UTC'$$;
CREATE OR REPLACE FUNCTION samekey_ms(t timestamptz) RETURNS BIGINT
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$SELECT (extract(epoch FROM t - TIMESTAMPTZ 'epoch') * 1000)::BIGINT$$;
-- One row per key: the receipt of its call.
CREATE TABLE IF NOT EXISTS samekey_receipts (
    key         BYTEA PRIMARY KEY,          -- SHA-256 of scope and key parts: the unique index
    scope       TEXT NOT NULL,              -- the function's scope, as its key was built in
    call_id     TEXT NOT NULL,              -- the call that holds (or held) the key
    state       TEXT NOT NULL,              -- RECEIVED PROCESSING UNKNOWN SUCCESS FAILED, or RELEASED
    fence       BIGINT NOT NULL,            -- the holder's fence: every claim or take-over raises it
    lease_until TIMESTAMPTZ,                -- PROCESSING: the holder's lease ends then (server clock)
    expires_at  TIMESTAMPTZ,                -- may be purged after then; NULL: kept (claims, UNKNOWN)
    fingerprint BYTEA,                      -- SHA-256 of the verify parts of the first call
    outcome     BYTEA,                      -- the encoded result (SUCCESS) or error (FAILED)
    created     TIMESTAMPTZ NOT NULL,       -- when the key was claimed (server clock)
    updated     TIMESTAMPTZ NOT NULL,       -- the record's latest change (server clock)
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
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'samekey_settled'
            AND tgrelid = to_regclass('samekey_receipts')) THEN
        CREATE TRIGGER samekey_settled AFTER UPDATE ON samekey_receipts FOR EACH ROW
            WHEN (OLD.waited AND (OLD.state IS DISTINCT FROM NEW.state OR OLD.fence <> NEW.fence))
            EXECUTE FUNCTION samekey_settled();
    END IF;
END $$;
CREATE INDEX IF NOT EXISTS samekey_receipts_call_id ON samekey_receipts (call_id);
CREATE INDEX IF NOT EXISTS samekey_receipts_expires_at ON samekey_receipts (expires_at)
    WHERE expires_at IS NOT NULL;
-- One row per queued call: the compensation queue.
CREATE TABLE IF NOT EXISTS samekey_compensation (
    call_id     TEXT PRIMARY KEY,
    key         BYTEA NOT NULL,             -- the call's key (samekey_receipts.key)
    scope       TEXT NOT NULL,
    reason      TEXT NOT NULL,              -- why it was queued, for people
    round       BIGINT NOT NULL,            -- rounds done so far
    next_at     TIMESTAMPTZ NOT NULL,       -- the next round is due then
    state       TEXT NOT NULL,              -- PENDING TAKEN MANUAL
    lease_until TIMESTAMPTZ,                -- TAKEN: the worker's lease ends then (server clock)
    enqueued    TIMESTAMPTZ NOT NULL,       -- when it was queued (the queuing node's clock)
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
-- The calls' events, a few dozen per key at most.
CREATE TABLE IF NOT EXISTS samekey_journal (
    seq         BIGSERIAL PRIMARY KEY,
    key         BYTEA NOT NULL,             -- the key's digest (samekey_receipts.key)
    call_id     TEXT NOT NULL,
    at          TIMESTAMPTZ NOT NULL,       -- when it happened, by the writing node's clock
    keep_until  TIMESTAMPTZ NOT NULL,       -- kept until then at least, and while the key's record lives
    event       JSONB NOT NULL              -- call_id, at_ms, node, event and its fields
);
CREATE INDEX IF NOT EXISTS samekey_journal_key ON samekey_journal (key, seq);
CREATE INDEX IF NOT EXISTS samekey_journal_call_id ON samekey_journal (call_id, seq);
CREATE INDEX IF NOT EXISTS samekey_journal_keep ON samekey_journal (keep_until);
-- Tables of an earlier release keep their times as BIGINT Unix ms: each such column becomes a
-- timestamptz, one ALTER TABLE (one rewrite, its indexes rebuilt) per table, every value exact.
DO $$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT a.attrelid::regclass AS tbl, string_agg(format(
                'ALTER COLUMN %I TYPE timestamptz USING samekey_ts(%I)', a.attname, a.attname),
            ', ' ORDER BY a.attnum) AS alters
        FROM (VALUES ('samekey_receipts', 'lease_until'), ('samekey_receipts', 'expires_at'),
        ('samekey_receipts', 'created'), ('samekey_receipts', 'updated'),
        ('samekey_compensation', 'next_at'), ('samekey_compensation', 'lease_until'),
        ('samekey_compensation', 'enqueued'),
        ('samekey_journal', 'at'), ('samekey_journal', 'keep_until')) AS c (tbl, col)
        JOIN pg_attribute a ON a.attrelid = to_regclass(c.tbl) AND a.attname = c.col
        WHERE a.atttypid = 'bigint'::regtype AND NOT a.attisdropped
        GROUP BY a.attrelid
    LOOP
        EXECUTE format('ALTER TABLE %s %s', t.tbl, t.alters);
    END LOOP;
END $$;
