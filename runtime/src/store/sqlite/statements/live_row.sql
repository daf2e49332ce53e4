-- A key's row, unless it expired.
-- $1 key, $2 now (ms).
SELECT key, scope, call_id, state, fence, lease_until, expires_at,
    fingerprint, outcome, created, updated
FROM samekey_receipts WHERE key = $1 AND (expires_at IS NULL OR expires_at > $2)
