-- The record a callId holds (not a released one), whatever its expiry.
-- ? callId.
SELECT r.`key`, r.scope, r.call_id, r.state, r.fence,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.lease_until) DIV 1000 AS lease_until,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.expires_at) DIV 1000 AS expires_at,
    r.fingerprint, r.outcome,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.created) DIV 1000 AS created,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.updated) DIV 1000 AS updated
FROM samekey_receipts r WHERE r.call_id = ? AND r.state <> 'RELEASED' LIMIT 1
