-- Queues a call for compensation, unless its callId is queued already.
-- $1 callId, $2 key, $3 scope, $4 reason, $5 round, $6 due time (ms), $7 enqueue time (ms),
-- $8 attempts, $9 last attempt's outcome, $10 inputs.
INSERT INTO samekey_compensation
    (call_id, key, scope, reason, round, next_at, state, lease_until, enqueued, attempts,
     last_error, inputs)
VALUES ($1, $2, $3, $4, $5, samekey_ts($6), 'PENDING', NULL, samekey_ts($7), $8, $9, $10)
ON CONFLICT (call_id) DO NOTHING
