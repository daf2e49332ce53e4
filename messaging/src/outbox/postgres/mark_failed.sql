-- Records a publish that failed: tried again after $3 ms (0: at once). $1 id, $2 the error.
UPDATE samekey_outbox
SET attempts = attempts + 1, last_error = $2,
    next_at = CASE WHEN $3 > 0 THEN statement_timestamp() + $3 * INTERVAL '1 millisecond' END
WHERE id = $1
