-- Stages a message, unless one with its id is staged: one row or none.
-- $1 ordering key, $2 message id, $3 destination, $4 headers (JSON text), $5 body.
INSERT INTO samekey_outbox (ordering_key, message_id, destination, headers, body)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (message_id) DO NOTHING
