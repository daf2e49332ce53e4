-- Takes the due entries (pending and due, or taken under a lease that lapsed), oldest due first, each
-- under a new worker fence; entries another worker is taking meanwhile are skipped, not waited for.
-- $1 lease (ms), $2 the caller's time (unused: the server's clock judges), $3 limit.
UPDATE samekey_compensation
SET state = 'TAKEN', lease_until = samekey_ts(samekey_now($2) + $1), taker = taker + 1
WHERE call_id IN (
    SELECT call_id FROM samekey_compensation
    WHERE (state = 'PENDING' AND next_at <= samekey_ts(samekey_now($2)))
        OR (state = 'TAKEN' AND lease_until <= samekey_ts(samekey_now($2)))
    ORDER BY next_at, enqueued LIMIT $3 FOR UPDATE SKIP LOCKED)
RETURNING call_id, key, scope, reason, round, samekey_ms(next_at) AS next_at, state,
    samekey_ms(lease_until) AS lease_until, samekey_ms(enqueued) AS enqueued, taker, attempts,
    last_error, inputs
