-- Queues a call for compensation, unless its callId is queued already. It is due the given delay
-- after the server's now: the server's clock judges when entries are due, never the queuing node's.
-- ? callId, ? key, ? scope, ? reason, ? round, ? delay before it is due (ms), ? enqueue time (ms,
-- the caller's), ? attempts, ? last attempt's outcome, ? inputs.
INSERT INTO samekey_compensation
    (call_id, `key`, scope, reason, round, next_at, state, lease_until, enqueued, attempts,
     last_error, inputs)
VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(3) + INTERVAL ? * 1000 MICROSECOND, 'PENDING', NULL,
    TIMESTAMP '1970-01-01 00:00:00' + INTERVAL ? * 1000 MICROSECOND, ?, ?, ?)
ON DUPLICATE KEY UPDATE call_id = call_id
