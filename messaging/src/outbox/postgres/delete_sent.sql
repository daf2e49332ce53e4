-- Deletes messages the broker confirmed (keep_sent 0). $1 their ids.
DELETE FROM samekey_outbox WHERE id = ANY($1)
