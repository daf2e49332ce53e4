-- Records a publish that failed, if batch $4 still holds it: tried again after $3 ms (0: at once).
-- $1 id, $2 the error.
UPDATE samekey_outbox
SET attempts = attempts + 1, last_error = $2, lease_until = NULL,
    next_at = CASE WHEN $3 > 0
        THEN strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', $3 / 1000.0)) END
WHERE id = $1 AND taker = $4 AND sent IS NULL
