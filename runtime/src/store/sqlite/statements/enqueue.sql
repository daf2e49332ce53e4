-- Queues a call for compensation, unless its callId is queued already. It is due `$6` ms after the
-- caller's time `$7` (SQLite has no clock of its own: the caller's judges).
-- $1 callId, $2 key, $3 scope, $4 reason, $5 round, $6 delay before it is due (ms), $7 enqueue time
-- (ms), $8 attempts, $9 last attempt's outcome, $10 inputs.
INSERT INTO samekey_compensation
    (call_id, key, scope, reason, round, next_at, state, lease_until, enqueued, attempts,
     last_error, inputs)
VALUES ($1, $2, $3, $4, $5, $7 + $6, 'PENDING', NULL, $7, $8, $9, $10)
ON CONFLICT (call_id) DO NOTHING
