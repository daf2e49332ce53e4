-- Deletes messages the broker confirmed (keep_sent 0), those batch $2 still holds. $1 their ids, a
-- JSON array.
DELETE FROM samekey_outbox WHERE id IN (SELECT value FROM json_each($1)) AND taker = $2 AND sent IS NULL
