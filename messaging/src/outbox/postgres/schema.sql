-- The outbox's table on PostgreSQL, idempotent: PgOutbox::migrate runs it in one transaction, under an
-- advisory lock, so that instances starting together do not race. Times are the server's clock.
CREATE TABLE IF NOT EXISTS samekey_outbox (
    id           BIGSERIAL PRIMARY KEY,      -- the order: a key's messages go out by it
    ordering_key TEXT NOT NULL,              -- messages of one key are published in order
    message_id   TEXT NOT NULL,              -- the broker's message id, on every publish
    destination  TEXT NOT NULL,              -- the routing key (AMQP) or subject (NATS)
    headers      JSONB NOT NULL,             -- [[name, value], ...]
    body         BYTEA NOT NULL,
    staged       TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
    attempts     BIGINT NOT NULL DEFAULT 0,  -- publishes tried that did not end confirmed
    last_error   TEXT,                       -- how the latest of them ended
    next_at      TIMESTAMPTZ,                -- a refused message is tried again from then
    sent         TIMESTAMPTZ,                -- confirmed by the broker then; NULL: waits
    CONSTRAINT samekey_outbox_message_id UNIQUE (message_id)
);
-- The messages that wait: each key's head (ordering_key, id), and all of them in order (id).
CREATE INDEX IF NOT EXISTS samekey_outbox_unsent ON samekey_outbox (ordering_key, id)
    WHERE sent IS NULL;
CREATE INDEX IF NOT EXISTS samekey_outbox_queue ON samekey_outbox (id) WHERE sent IS NULL;
-- The sent ones, for the purge.
CREATE INDEX IF NOT EXISTS samekey_outbox_sent ON samekey_outbox (sent) WHERE sent IS NOT NULL;
