-- Marks messages sent (the broker confirmed them). $1 their ids.
UPDATE samekey_outbox SET sent = statement_timestamp(), next_at = NULL WHERE id = ANY($1)
