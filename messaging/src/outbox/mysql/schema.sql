-- The outbox's tables on MySQL 8 / MariaDB 10.6+, idempotent: MySqlOutbox::migrate runs it under
-- GET_LOCK('samekey.outbox.migrate'), so that instances starting together do not race. Times are
-- DATETIME(3) in UTC, written and judged by the server's clock (UTC_TIMESTAMP(3)), as the store's.
CREATE TABLE IF NOT EXISTS samekey_outbox (
    id           BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, -- the order: a key's messages go out by it
    -- Bytes (UTF-8), compared exactly; MySqlOutbox refuses longer ones before writing.
    ordering_key VARBINARY(1024) NOT NULL,  -- messages of one key are published in order
    message_id   VARBINARY(1024) NOT NULL,  -- the broker's message id, on every publish
    destination  VARBINARY(1024) NOT NULL,  -- the routing key (AMQP) or subject (NATS)
    headers      LONGTEXT NOT NULL,         -- JSON: [[name, value], ...]
    body         LONGBLOB NOT NULL,
    staged       DATETIME(3) NOT NULL,      -- when it was staged (UTC)
    attempts     BIGINT NOT NULL DEFAULT 0, -- publishes tried that did not end confirmed
    last_error   TEXT NULL,                 -- how the latest of them ended
    next_at      DATETIME(3) NULL,          -- a refused message is tried again from then (UTC)
    sent         DATETIME(3) NULL,          -- confirmed by the broker then (UTC); NULL: waits
    UNIQUE KEY samekey_outbox_message_id (message_id),
    -- The messages that wait, each key's head first (sent IS NULL, ordering_key, id); the sent ones,
    -- for the purge.
    KEY samekey_outbox_unsent (sent, ordering_key, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- The stagings' locks: a stage holds its ordering key's bucket (CRC32 % 1000) until its transaction
-- ends, so that two transactions staging under one key get their ids in the order they commit.
CREATE TABLE IF NOT EXISTS samekey_outbox_lock (
    bucket SMALLINT NOT NULL PRIMARY KEY
) ENGINE = InnoDB;
INSERT INTO samekey_outbox_lock (bucket)
SELECT a.d * 100 + b.d * 10 + c.d FROM
    (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
     UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) a,
    (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
     UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) b,
    (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
     UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) c
ON DUPLICATE KEY UPDATE bucket = samekey_outbox_lock.bucket;
