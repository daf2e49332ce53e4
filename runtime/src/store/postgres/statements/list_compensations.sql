-- Every compensation entry, in the order they were queued.
SELECT call_id, key, scope, reason, round, samekey_ms(next_at) AS next_at, state,
    samekey_ms(lease_until) AS lease_until, samekey_ms(enqueued) AS enqueued, taker, attempts,
    last_error, inputs
FROM samekey_compensation ORDER BY samekey_compensation.enqueued, call_id
