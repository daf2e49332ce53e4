-- The outbox's table on SQLite, idempotent: SqliteOutbox::migrate runs it. Times are the database's
-- clock, UTC text 'YYYY-MM-DD HH:MM:SS.SSS' (they compare as text, and sqlite3's date functions read
-- them).
CREATE TABLE IF NOT EXISTS samekey_outbox (
    id           INTEGER PRIMARY KEY AUTOINCREMENT, -- the order: a key's messages go out by it
    ordering_key TEXT NOT NULL,            -- messages of one key are published in order
    message_id   TEXT NOT NULL UNIQUE,     -- the broker's message id, on every publish
    destination  TEXT NOT NULL,            -- the routing key (AMQP) or subject (NATS)
    headers      TEXT NOT NULL,            -- JSON: [[name, value], ...]
    body         BLOB NOT NULL,
    staged       TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    attempts     INTEGER NOT NULL DEFAULT 0, -- publishes tried that did not end confirmed
    last_error   TEXT,                     -- how the latest of them ended
    next_at      TEXT,                     -- a refused message is tried again from then
    lease_until  TEXT,                     -- a relay holds the row until then
    taker        INTEGER,                  -- the token of the batch that took it last
    sent         TEXT                      -- confirmed by the broker then; NULL: waits
);
-- The messages that wait: each key's head (ordering_key, id), and all of them in order (id).
CREATE INDEX IF NOT EXISTS samekey_outbox_unsent ON samekey_outbox (ordering_key, id)
    WHERE sent IS NULL;
CREATE INDEX IF NOT EXISTS samekey_outbox_queue ON samekey_outbox (id) WHERE sent IS NULL;
-- The sent ones, for the purge.
CREATE INDEX IF NOT EXISTS samekey_outbox_sent ON samekey_outbox (sent) WHERE sent IS NOT NULL;
