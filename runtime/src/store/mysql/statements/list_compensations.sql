-- Every compensation entry, in the order they were queued.
SELECT c.call_id, c.`key`, c.scope, c.reason, c.round,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', c.next_at) DIV 1000 AS next_at, c.state,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', c.lease_until) DIV 1000 AS lease_until,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', c.enqueued) DIV 1000 AS enqueued, c.taker, c.attempts, c.last_error, c.inputs
FROM samekey_compensation c ORDER BY c.enqueued, c.call_id
