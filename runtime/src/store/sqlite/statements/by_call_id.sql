-- The record a callId holds (not a released one), whatever its expiry.
-- $1 callId.
SELECT key, scope, call_id, state, fence, lease_until, expires_at,
    fingerprint, outcome, created, updated
FROM samekey_receipts WHERE call_id = $1 AND state <> 'RELEASED' LIMIT 1
