-- The MySQL store's schema, idempotent: MySqlStore::migrate runs it under GET_LOCK('samekey.migrate'),
-- so that instances starting together do not race. The dialect is the one MySQL 8 and MariaDB 10.6+
-- share. Times are DATETIME(3) in UTC, written and judged by the server's clock (UTC_TIMESTAMP(3)):
-- a mysql client shows them as they are stored, whatever the session's time_zone (a TIMESTAMP
-- column would be shown in the session's zone, and ends in 2038). Text compares byte by byte
-- (utf8mb4_bin), as on PostgreSQL.
-- The fence floor: a key's new row takes the floor + 1 as its fence, and a purge raises the floor to
-- the fences of the rows it deletes first, so that a key's fences never repeat, even after a purge.
CREATE TABLE IF NOT EXISTS samekey_fence (
    id          TINYINT NOT NULL PRIMARY KEY,  -- always 1
    floor       BIGINT NOT NULL                -- at least every fence a purged row carried
) ENGINE = InnoDB;
INSERT INTO samekey_fence (id, floor) VALUES (1, 0) ON DUPLICATE KEY UPDATE id = id;
-- One row per key: the receipt of its call.
CREATE TABLE IF NOT EXISTS samekey_receipts (
    `key`       VARBINARY(32) NOT NULL PRIMARY KEY,  -- SHA-256 of scope and key parts: the unique index
    scope       MEDIUMTEXT NOT NULL,           -- the function's scope, as its key was built in
    scope_digest BINARY(32) AS (UNHEX(SHA2(scope, 256))) STORED, -- the scope's SHA-256, for its index
    call_id     VARCHAR(255) NOT NULL,         -- the call that holds (or held) the key
    state       VARCHAR(16) NOT NULL,          -- RECEIVED PROCESSING UNKNOWN SUCCESS FAILED, or RELEASED
    fence       BIGINT NOT NULL,               -- the holder's fence: every claim or take-over raises it
    lease_until DATETIME(3) NULL,              -- PROCESSING: the holder's lease ends then (UTC)
    expires_at  DATETIME(3) NULL,              -- may be purged after then; NULL: kept (claims, UNKNOWN)
    fingerprint VARBINARY(32) NULL,            -- SHA-256 of the verify parts of the first call
    outcome     LONGBLOB NULL,                 -- the encoded result (SUCCESS) or error (FAILED)
    created     DATETIME(3) NOT NULL,          -- when the key was claimed (UTC)
    updated     DATETIME(3) NOT NULL,          -- the record's latest change (UTC)
    KEY samekey_receipts_call_id (call_id),
    KEY samekey_receipts_expires_at (expires_at),
    KEY samekey_receipts_orphans (state, lease_until),
    KEY samekey_receipts_created (created, `key`),
    -- A scope of any length, compared byte for byte (not as the PAD SPACE collation would).
    KEY samekey_receipts_scope_created (scope_digest, created, `key`)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- One row per queued call: the compensation queue.
CREATE TABLE IF NOT EXISTS samekey_compensation (
    call_id     VARCHAR(255) NOT NULL PRIMARY KEY,
    `key`       VARBINARY(32) NOT NULL,        -- the call's key (samekey_receipts.key)
    scope       MEDIUMTEXT NOT NULL,           -- the operation the worker runs it by
    reason      TEXT NOT NULL,                 -- why it was queued, for people
    round       BIGINT NOT NULL,               -- rounds done so far
    next_at     DATETIME(3) NOT NULL,          -- the next round is due then (UTC)
    state       VARCHAR(16) NOT NULL,          -- PENDING TAKEN MANUAL
    lease_until DATETIME(3) NULL,              -- TAKEN: the worker's lease ends then (UTC)
    enqueued    DATETIME(3) NOT NULL,          -- when it was queued (the queuing node's clock)
    taker       BIGINT NOT NULL DEFAULT 0,     -- the worker fence of the latest take
    attempts    BIGINT NOT NULL DEFAULT 0,     -- attempts the call made before it was queued
    last_error  VARCHAR(64) NULL,              -- how its last attempt ended: timed_out, unknown, …
    inputs      LONGBLOB NULL,                 -- its inputs (JSON), when its function keeps them
    KEY samekey_compensation_due (next_at),
    KEY samekey_compensation_taken (state, lease_until)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- The calls' events, a few dozen per key at most.
CREATE TABLE IF NOT EXISTS samekey_journal (
    seq         BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    `key`       VARBINARY(32) NOT NULL,        -- the key's digest (samekey_receipts.key)
    call_id     VARCHAR(255) NOT NULL,
    at          DATETIME(3) NOT NULL,          -- when it happened, by the writing node's clock (UTC)
    keep_until  DATETIME(3) NOT NULL,          -- kept until then at least, and while the key's record lives
    event       LONGTEXT NOT NULL,             -- call_id, at_ms, node, event and its fields (JSON text)
    KEY samekey_journal_key (`key`, seq),
    KEY samekey_journal_call_id (call_id, seq),
    KEY samekey_journal_keep (keep_until)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- The schema's version: a later release's migrate reads it to know what an earlier one left.
CREATE TABLE IF NOT EXISTS samekey_schema (
    id          TINYINT NOT NULL PRIMARY KEY,  -- always 1
    version     INT NOT NULL
) ENGINE = InnoDB;
INSERT INTO samekey_schema (id, version) VALUES (1, 1) ON DUPLICATE KEY UPDATE version = GREATEST(version, 1);
