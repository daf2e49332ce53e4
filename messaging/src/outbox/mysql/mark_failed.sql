-- Records a publish that failed: tried again after retry_ms (0: at once). The parameters are named
-- in the derived table p, in the order they are bound: ? id, ? the error, ? retry_ms.
UPDATE samekey_outbox o
    JOIN (SELECT ? AS id, ? AS error, ? AS retry_ms) AS p ON o.id = p.id
SET o.attempts = o.attempts + 1, o.last_error = p.error,
    o.next_at = IF(p.retry_ms > 0, UTC_TIMESTAMP(3) + INTERVAL p.retry_ms * 1000 MICROSECOND, NULL)
