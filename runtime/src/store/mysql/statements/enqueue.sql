-- Queues a call for compensation, unless its callId is queued already.
-- ? callId, ? key, ? scope, ? reason, ? round, ? due time (ms), ? enqueue time (ms), ? attempts,
-- ? last attempt's outcome, ? inputs.
INSERT INTO samekey_compensation
    (call_id, `key`, scope, reason, round, next_at, state, lease_until, enqueued, attempts,
     last_error, inputs)
VALUES (?, ?, ?, ?, ?, TIMESTAMP '1970-01-01 00:00:00' + INTERVAL ? * 1000 MICROSECOND, 'PENDING', NULL,
    TIMESTAMP '1970-01-01 00:00:00' + INTERVAL ? * 1000 MICROSECOND, ?, ?, ?)
ON DUPLICATE KEY UPDATE call_id = call_id
