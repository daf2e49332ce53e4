-- Stages a message: one row, or the duplicate-key error 1062 when one with its id is staged (which
-- undoes this statement only, not the caller's transaction).
-- ? ordering key, ? message id, ? destination, ? headers (JSON text), ? body.
INSERT INTO samekey_outbox (ordering_key, message_id, destination, headers, body, staged)
VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(3))
