-- Deletes a message the broker confirmed (keep_sent 0). $1 its id.
DELETE FROM samekey_outbox WHERE id = $1
