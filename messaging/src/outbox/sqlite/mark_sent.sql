-- Marks a message sent (the broker confirmed it), if batch $2 still holds it. $1 its id.
UPDATE samekey_outbox
SET sent = strftime('%Y-%m-%d %H:%M:%f', 'now'), lease_until = NULL, next_at = NULL
WHERE id = $1 AND taker = $2 AND sent IS NULL
