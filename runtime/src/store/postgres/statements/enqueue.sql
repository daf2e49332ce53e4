-- Queues a call for compensation, unless its callId is queued already. It is due `$6` ms after the
-- server's now: the server's clock judges when entries are due, never the queuing node's.
-- $1 callId, $2 key, $3 scope, $4 reason, $5 round, $6 delay before it is due (ms), $7 enqueue time
-- (ms, the caller's), $8 attempts, $9 last attempt's outcome, $10 inputs.
INSERT INTO samekey_compensation
    (call_id, key, scope, reason, round, next_at, state, lease_until, enqueued, attempts,
     last_error, inputs)
VALUES ($1, $2, $3, $4, $5, samekey_ts(samekey_now($7) + $6), 'PENDING', NULL, samekey_ts($7), $8,
    $9, $10)
ON CONFLICT (call_id) DO NOTHING
