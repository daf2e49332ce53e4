-- A key's row, whatever its expiry.
-- $1 key.
SELECT key, scope, call_id, state, fence, lease_until, expires_at,
    fingerprint, outcome, created, updated
FROM samekey_receipts WHERE key = $1
