-- Marks messages sent (the broker confirmed them), those batch $2 still holds. $1 their ids, a JSON
-- array.
UPDATE samekey_outbox
SET sent = strftime('%Y-%m-%d %H:%M:%f', 'now'), lease_until = NULL, next_at = NULL
WHERE id IN (SELECT value FROM json_each($1)) AND taker = $2 AND sent IS NULL
