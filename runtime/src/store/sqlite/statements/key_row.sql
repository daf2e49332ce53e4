-- A key's row, whatever its expiry.
-- $1 key.
SELECT key, scope, call_id, state, fence, lease_until AS lease_until, expires_at AS expires_at,
    fingerprint, outcome, created AS created, updated AS updated
FROM samekey_receipts WHERE key = $1
