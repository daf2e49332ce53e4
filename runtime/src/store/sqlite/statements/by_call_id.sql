-- The record a callId holds (not a released one), whatever its expiry.
-- $1 callId.
SELECT key, scope, call_id, state, fence, lease_until AS lease_until, expires_at AS expires_at,
    fingerprint, outcome, created AS created, updated AS updated
FROM samekey_receipts WHERE call_id = $1 AND state <> 'RELEASED' LIMIT 1
