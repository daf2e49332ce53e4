-- Takes the due entries (pending and due, or taken under a lease that lapsed), oldest due first, each
-- under a new worker fence (SQLite runs one writer at a time: no row is taken twice).
-- $1 lease (ms), $2 now (ms), $3 limit.
UPDATE samekey_compensation SET state = 'TAKEN', lease_until = $2 + $1, taker = taker + 1
WHERE call_id IN (
    SELECT call_id FROM samekey_compensation
    WHERE (state = 'PENDING' AND next_at <= $2)
        OR (state = 'TAKEN' AND lease_until <= $2)
    ORDER BY next_at, enqueued LIMIT $3)
RETURNING call_id, key, scope, reason, round, next_at, state, lease_until,
    enqueued, taker, attempts, last_error, inputs
