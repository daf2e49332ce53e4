-- Every compensation entry, in the order they were queued.
SELECT call_id, key, scope, reason, round, next_at AS next_at, state, lease_until AS lease_until,
    enqueued AS enqueued, taker, attempts, last_error, inputs
FROM samekey_compensation ORDER BY samekey_compensation.enqueued, call_id
