-- Every compensation entry, in the order they were queued.
SELECT call_id, key, scope, reason, round, next_at, state, lease_until,
    enqueued, taker, attempts, last_error, inputs
FROM samekey_compensation ORDER BY samekey_compensation.enqueued, call_id
