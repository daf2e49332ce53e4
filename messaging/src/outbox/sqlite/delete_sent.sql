-- Deletes a message the broker confirmed (keep_sent 0), if batch $2 still holds it. $1 its id.
DELETE FROM samekey_outbox WHERE id = $1 AND taker = $2 AND sent IS NULL
