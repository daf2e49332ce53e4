-- The record a callId holds (not a released one), whatever its expiry.
-- $1 callId.
SELECT key, scope, call_id, state, fence, samekey_ms(lease_until) AS lease_until,
    samekey_ms(expires_at) AS expires_at, fingerprint, outcome, samekey_ms(created) AS created,
    samekey_ms(updated) AS updated
FROM samekey_receipts WHERE call_id = $1 AND state <> 'RELEASED' LIMIT 1
