
CREATE TABLE IF NOT EXISTS samekey_receipts (
    key         BLOB PRIMARY KEY NOT NULL,  -- SHA-256 of scope and key parts: the unique index
    scope       TEXT NOT NULL,
    call_id     TEXT NOT NULL,
    state       TEXT NOT NULL,              -- RECEIVED PROCESSING UNKNOWN SUCCESS FAILED, or RELEASED
    fence       INTEGER NOT NULL,
    lease_until INTEGER,
    expires_at  INTEGER,
    fingerprint BLOB,
    outcome     BLOB,
    created     INTEGER NOT NULL,
    updated     INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS samekey_receipts_call_id ON samekey_receipts (call_id);
CREATE INDEX IF NOT EXISTS samekey_receipts_expires_at ON samekey_receipts (expires_at)
    WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS samekey_receipts_orphans ON samekey_receipts (lease_until)
    WHERE state = 'PROCESSING';
CREATE INDEX IF NOT EXISTS samekey_receipts_created ON samekey_receipts (created, key);
CREATE INDEX IF NOT EXISTS samekey_receipts_scope_created ON samekey_receipts (scope, created, key);
CREATE TABLE IF NOT EXISTS samekey_compensation (
    call_id     TEXT PRIMARY KEY NOT NULL,
    key         BLOB NOT NULL,
    scope       TEXT NOT NULL,
    reason      TEXT NOT NULL,
    round       INTEGER NOT NULL,
    next_at     INTEGER NOT NULL,
    state       TEXT NOT NULL,              -- PENDING TAKEN MANUAL
    lease_until INTEGER,
    enqueued    INTEGER NOT NULL,
    taker       INTEGER NOT NULL DEFAULT 0, -- the worker fence of the latest take
    attempts    INTEGER NOT NULL DEFAULT 0, -- attempts the call made before it was queued
    last_error  TEXT,                       -- how its last attempt ended: timed_out, unknown, …
    inputs      BLOB                        -- its inputs (JSON), when its function keeps them
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS samekey_journal (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    key         BLOB NOT NULL,              -- the key's digest (samekey_receipts.key)
    call_id     TEXT NOT NULL,
    at          INTEGER NOT NULL,           -- Unix ms, by the writing node's clock
    keep_until  INTEGER NOT NULL,           -- kept until then at least, and while the key's record lives
    event       TEXT NOT NULL               -- JSON: call_id, at_ms, node, event and its fields
);
CREATE INDEX IF NOT EXISTS samekey_journal_key ON samekey_journal (key, seq);
CREATE INDEX IF NOT EXISTS samekey_journal_call_id ON samekey_journal (call_id, seq);
CREATE INDEX IF NOT EXISTS samekey_journal_keep ON samekey_journal (keep_until);
