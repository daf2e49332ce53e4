-- Marks a message sent (the broker confirmed it). $1 its id.
UPDATE samekey_outbox SET sent = statement_timestamp(), next_at = NULL WHERE id = $1
